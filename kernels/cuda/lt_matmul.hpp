// GEMMs on cuBLASLt: bf16 (or f32) operands, fp32 accumulation, with the heuristic's choice of
// algorithm cached per shape and one workspace for all calls.
//
// The heuristic is told how each matrix is aligned (its pointer and its leading dimension in
// bytes, up to 256): by default it assumes 256 bytes and may return an algorithm that needs them,
// which then fails on a view into a buffer (a slice of the flat weights, a chunk of rows). The
// alignments are part of the plan's key.
//
// Shapes are written for row-major operands (the layout of every tensor here); the class maps
// them to cuBLASLt's column-major view (a row-major (r x c) matrix is a column-major (c x r)).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/cuda/scratch_sizes.hpp"
#include "kernels/tensor.hpp"

namespace l3::cuda {

// C (rows x cols, row-major, leading dimension ldc) = alpha * op(A) op(B) + beta * C, where
// op(A) is (rows x inner) and op(B) is (inner x cols); A is stored (rows x inner) with leading
// dimension lda, or (inner x rows) when transpose_a; likewise B.
struct RowMajorGemm {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t inner = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  const void* a = nullptr;
  std::int64_t lda = 0;
  kernels::DType a_type = kernels::DType::bf16;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  kernels::DType b_type = kernels::DType::bf16;
  void* c = nullptr;
  std::int64_t ldc = 0;
  kernels::DType c_type = kernels::DType::bf16;
  float alpha = 1.0F;
  float beta = 0.0F;
};

class LtMatmul {
 public:
  explicit LtMatmul(std::size_t workspace_bytes = kLtWorkspaceBytes);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  LtMatmul(LtMatmul&&) = delete;
  LtMatmul& operator=(LtMatmul&&) = delete;

  void run(const RowMajorGemm& gemm, cudaStream_t stream);

 private:
  // (transa, transb, m, n, k, lda, ldb, ldc, types, beta != 0, alignments of A, B and C in
  // bytes) in cuBLASLt's column-major terms
  using Key =
      std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                 std::int64_t, int, bool, std::uint32_t, std::uint32_t, std::uint32_t>;
  struct Plan;

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace l3::cuda
