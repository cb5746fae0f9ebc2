#include "kernels/cuda/lt_matmul.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace l3::cuda {

namespace {

cudaDataType_t cuda_type(kernels::DType t) {
  switch (t) {
    case kernels::DType::bf16:
      return CUDA_R_16BF;
    case kernels::DType::f32:
      return CUDA_R_32F;
    default:
      throw core::internal_error("cuBLASLt GEMM on an integer tensor");
  }
}

// The largest power of two, up to 256 (cuBLASLt's default assumption), that divides both the
// address and the leading dimension in bytes: what an algorithm may rely on for this matrix.
std::uint32_t alignment_bytes(const void* pointer, std::int64_t ld, kernels::DType type) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  const auto row_bytes = static_cast<std::uintptr_t>(ld) * kernels::dtype_size(type);
  std::uint32_t alignment = 256;
  while (alignment > 1 && (address % alignment != 0 || row_bytes % alignment != 0)) alignment /= 2;
  return alignment;
}

// RAII for the cuBLASLt descriptors of one shape.
struct Layout {
  cublasLtMatrixLayout_t handle = nullptr;
  Layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    check(cublasLtMatrixLayoutCreate(&handle, type, static_cast<std::uint64_t>(rows),
                                     static_cast<std::uint64_t>(cols), ld),
          "cublasLtMatrixLayoutCreate");
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(handle); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  Layout(Layout&&) = delete;
  Layout& operator=(Layout&&) = delete;
};

// RAII for the heuristic's preferences: the workspace it may use and the alignment of each matrix.
struct Preference {
  cublasLtMatmulPreference_t handle = nullptr;
  Preference(std::uint64_t max_workspace, std::uint32_t align_a, std::uint32_t align_b,
             std::uint32_t align_c, const std::string& shape) {
    check(cublasLtMatmulPreferenceCreate(&handle), "cublasLtMatmulPreferenceCreate");
    try {
      check(cublasLtMatmulPreferenceSetAttribute(handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &max_workspace, sizeof(max_workspace)),
            "set the workspace limit for GEMM " + shape);
      const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> alignments[] = {
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};  // D is C's buffer
      for (const auto& [attribute, bytes] : alignments) {
        check(cublasLtMatmulPreferenceSetAttribute(handle, attribute, &bytes, sizeof(bytes)),
              "set the minimum alignment for GEMM " + shape);
      }
    } catch (...) {
      cublasLtMatmulPreferenceDestroy(handle);
      throw;
    }
  }
  ~Preference() { cublasLtMatmulPreferenceDestroy(handle); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  Preference(Preference&&) = delete;
  Preference& operator=(Preference&&) = delete;
};

}  // namespace

struct LtMatmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  std::unique_ptr<Layout> a, b, c;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  ~Plan() { cublasLtMatmulDescDestroy(desc); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  Plan(Plan&&) = delete;
  Plan& operator=(Plan&&) = delete;
};

LtMatmul::LtMatmul(std::size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  check(cublasLtCreate(&handle_), "cublasLtCreate");
  check(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc of the cuBLASLt workspace");
}

LtMatmul::~LtMatmul() {
  plans_.clear();
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

void LtMatmul::run(const RowMajorGemm& g, cudaStream_t stream) {
  if (g.rows == 0 || g.cols == 0) return;
  // Row-major C (rows x cols) is column-major C^T (cols x rows) = op(B)^T op(A)^T: cuBLASLt's
  // "A" is our B and its "B" is our A, each with its transposition flag kept.
  const bool trans_a_cm = g.transpose_b;
  const bool trans_b_cm = g.transpose_a;
  const std::int64_t m = g.cols;
  const std::int64_t n = g.rows;
  const std::int64_t k = g.inner;
  const std::uint32_t align_a = alignment_bytes(g.b, g.ldb, g.b_type);  // cuBLASLt's A is our B
  const std::uint32_t align_b = alignment_bytes(g.a, g.lda, g.a_type);
  const std::uint32_t align_c = alignment_bytes(g.c, g.ldc, g.c_type);  // C and D: one buffer
  const Key key{trans_a_cm,
                trans_b_cm,
                m,
                n,
                k,
                g.ldb,
                g.lda,
                g.ldc,
                static_cast<int>(g.a_type) * 100 + static_cast<int>(g.b_type) * 10 +
                    static_cast<int>(g.c_type),
                g.beta != 0.0F,
                align_a,
                align_b,
                align_c};
  // Formatted only when a plan is made or a call fails: run() is on every step's hot path.
  const auto describe = [&g] {
    return fmt::format("({} x {}) = ({} x {}){} ({} x {}){}, alignments {}/{}/{} bytes", g.rows,
                       g.cols, g.rows, g.inner, g.transpose_a ? "^T" : "", g.inner, g.cols,
                       g.transpose_b ? "^T" : "", alignment_bytes(g.a, g.lda, g.a_type),
                       alignment_bytes(g.b, g.ldb, g.b_type),
                       alignment_bytes(g.c, g.ldc, g.c_type));
  };
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    const std::string shape = describe();
    auto plan = std::make_unique<Plan>();
    check(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
          "cublasLtMatmulDescCreate " + shape);
    const cublasOperation_t op_a = trans_a_cm ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b_cm ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                         sizeof(op_a)),
          "set TRANSA");
    check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                         sizeof(op_b)),
          "set TRANSB");
    // Column-major stored shapes: "A" (our B) is (k x m) transposed or (m x k) not.
    plan->a = std::make_unique<Layout>(cuda_type(g.b_type), trans_a_cm ? k : m, trans_a_cm ? m : k,
                                       g.ldb);
    plan->b = std::make_unique<Layout>(cuda_type(g.a_type), trans_b_cm ? n : k, trans_b_cm ? k : n,
                                       g.lda);
    plan->c = std::make_unique<Layout>(cuda_type(g.c_type), m, n, g.ldc);

    const Preference preference(workspace_bytes_, align_a, align_b, align_c, shape);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle_, plan->desc, plan->a->handle, plan->b->handle, plan->c->handle, plan->c->handle,
        preference.handle, 1, &result, &found);
    check(status, "cublasLtMatmulAlgoGetHeuristic " + shape);
    if (found == 0) throw core::internal_error("cuBLASLt has no algorithm for GEMM " + shape);
    plan->algo = result.algo;
    it = plans_.emplace(key, std::move(plan)).first;
  }
  const Plan& plan = *it->second;
  const cublasStatus_t status = cublasLtMatmul(
      handle_, plan.desc, &g.alpha, g.b, plan.a->handle, g.a, plan.b->handle, &g.beta, g.c,
      plan.c->handle, g.c, plan.c->handle, &plan.algo, workspace_, workspace_bytes_, stream);
  if (status != CUBLAS_STATUS_SUCCESS) check(status, "cublasLtMatmul " + describe());
}

}  // namespace l3::cuda
