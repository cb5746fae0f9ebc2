#include "kernels/cuda/lt_matmul.hpp"

#include <fmt/format.h>

#include <memory>

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

}  // namespace

struct LtMatmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  std::unique_ptr<Layout> a, b, c;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() { cublasLtMatmulDescDestroy(desc); }
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
                g.beta != 0.0F};
  const std::string shape =
      fmt::format("({} x {}) = ({} x {}){} ({} x {}){}", g.rows, g.cols, g.rows, g.inner,
                  g.transpose_a ? "^T" : "", g.inner, g.cols, g.transpose_b ? "^T" : "");
  auto it = plans_.find(key);
  if (it == plans_.end()) {
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

    cublasLtMatmulPreference_t preference = nullptr;
    check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t max_workspace = workspace_bytes_;
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &max_workspace, sizeof(max_workspace));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle_, plan->desc, plan->a->handle, plan->b->handle, plan->c->handle, plan->c->handle,
        preference, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(preference);
    check(status, "cublasLtMatmulAlgoGetHeuristic " + shape);
    if (found == 0) throw core::internal_error("cuBLASLt has no algorithm for GEMM " + shape);
    plan->algo = result.algo;
    it = plans_.emplace(key, std::move(plan)).first;
  }
  const Plan& plan = *it->second;
  check(cublasLtMatmul(handle_, plan.desc, &g.alpha, g.b, plan.a->handle, g.a, plan.b->handle,
                       &g.beta, g.c, plan.c->handle, g.c, plan.c->handle, &plan.algo, workspace_,
                       workspace_bytes_, stream),
        "cublasLtMatmul " + shape);
}

}  // namespace l3::cuda
