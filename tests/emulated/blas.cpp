// cuBLAS and cuBLASLt GEMMs on the host for the emulated build: what the backend asks of them
// (column-major D = alpha op(A) op(B) + beta C, bf16 or fp32 operands, fp32 compute) through
// OpenBLAS's SGEMM on fp32 copies of the operands, the result rounded to D's type. Anything
// else the backend might set (epilogues, other types or compute modes) is refused with
// CUBLAS_STATUS_NOT_SUPPORTED, so that a new use fails loudly instead of computing wrong.
//
// Pointer alignment is modelled as strictly as cuBLASLt allows: its heuristic assumes every
// matrix 256-byte aligned unless the preference says less (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*),
// and may return an algorithm that needs all of it, which then fails or faults on a pointer
// aligned less. So the emulated heuristic's algorithm needs exactly what the preference promised,
// and cublasLtMatmul refuses (CUBLAS_STATUS_INVALID_VALUE) a pointer aligned less than that.
#include <cblas.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_emulation.hpp"

struct cublasContext {
  cudaStream_t stream = nullptr;
};
struct cublasLtContext {};

namespace {

// Our descriptors live inside cuBLASLt's semi-opaque structs (their size is public).
struct Desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a;
  cublasOperation_t trans_b;
  bool unsupported;
};
struct LayoutDesc {
  cudaDataType_t type;
  std::uint64_t rows;
  std::uint64_t cols;
  std::int64_t ld;
};
// Bytes each of A, B, C and D is promised (preference) or needs (algorithm) to be aligned to.
struct Alignments {
  std::uint64_t a = 256;  // cuBLASLt's documented default for every matrix
  std::uint64_t b = 256;
  std::uint64_t c = 256;
  std::uint64_t d = 256;
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(LayoutDesc) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(Alignments) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(Alignments) <= sizeof(cublasLtMatmulAlgo_t));

bool aligned(const void* pointer, std::uint64_t bytes) {
  return bytes == 0 || reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

bool supported(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_32F; }

float load(cudaDataType_t t, const void* base, std::int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(base)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}
void store(cudaDataType_t t, void* base, std::int64_t i, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16(v);  // round to nearest even
  }
}

// The stored (rows x cols, leading dimension ld) column-major matrix as dense fp32.
std::vector<float> dense(cudaDataType_t t, const void* base, std::int64_t rows, std::int64_t cols,
                         std::int64_t ld) {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t c = 0; c < cols; ++c)
    for (std::int64_t r = 0; r < rows; ++r)
      out[static_cast<std::size_t>(r + c * rows)] = load(t, base, r + c * ld);
  return out;
}

// D (m x n, ldd) = alpha op(A) op(B) + beta C, column-major; C and D may be the same array.
// With run false, only checks the arguments (at the call; the product runs when its stream does).
cublasStatus_t gemm(bool run, cublasOperation_t ta, cublasOperation_t tb, std::int64_t m,
                    std::int64_t n, std::int64_t k, float alpha, cudaDataType_t a_type,
                    const void* a, std::int64_t lda, cudaDataType_t b_type, const void* b,
                    std::int64_t ldb, float beta, cudaDataType_t c_type, const void* c,
                    std::int64_t ldc, cudaDataType_t d_type, void* d, std::int64_t ldd) {
  if (!supported(a_type) || !supported(b_type) || !supported(c_type) || !supported(d_type)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool trans_a = ta == CUBLAS_OP_T;
  const bool trans_b = tb == CUBLAS_OP_T;
  const std::int64_t a_rows = trans_a ? k : m;
  const std::int64_t a_cols = trans_a ? m : k;
  const std::int64_t b_rows = trans_b ? n : k;
  const std::int64_t b_cols = trans_b ? k : n;
  if (lda < a_rows || ldb < b_rows || ldd < m || (beta != 0.0F && ldc < m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!run || m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const std::vector<float> da = dense(a_type, a, a_rows, a_cols, lda);
  const std::vector<float> db = dense(b_type, b, b_rows, b_cols, ldb);
  std::vector<float> product(static_cast<std::size_t>(m * n), 0.0F);
  if (k > 0) {
    cblas_sgemm(CblasColMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
                static_cast<blasint>(n), static_cast<blasint>(k), alpha, da.data(),
                static_cast<blasint>(a_rows), db.data(), static_cast<blasint>(b_rows), 0.0F,
                product.data(), static_cast<blasint>(m));
  }
  for (std::int64_t col = 0; col < n; ++col) {
    for (std::int64_t row = 0; row < m; ++row) {
      float v = product[static_cast<std::size_t>(row + col * m)];
      if (beta != 0.0F) v += beta * load(c_type, c, row + col * ldc);  // fp32, then one rounding
      store(d_type, d, row + col * ldd, v);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    default:
      return "CUBLAS_STATUS (emulated)";
  }
}
const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED ? "not modelled by the llama3-hpc CUDA emulation"
                                               : cublasGetStatusName(status);
}

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void* alpha, const void* a, cudaDataType a_type,
                                          int lda, long long stride_a, const void* b,
                                          cudaDataType b_type, int ldb, long long stride_b,
                                          const void* beta, void* c, cudaDataType c_type, int ldc,
                                          long long stride_c, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t /*algo*/) {
  if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  const float al = *static_cast<const float*>(alpha);
  const float be = *static_cast<const float*>(beta);
  auto at = [](cudaDataType t, const void* base, long long offset) {
    return static_cast<const char*>(base) + offset * (t == CUDA_R_32F ? 4 : 2);
  };
  for (int i = 0; i < batch; ++i) {
    void* ci = const_cast<char*>(at(c_type, c, stride_c * i));
    const cublasStatus_t s =
        gemm(false, ta, tb, m, n, k, al, a_type, at(a_type, a, stride_a * i), lda, b_type,
             at(b_type, b, stride_b * i), ldb, be, c_type, ci, ldc, c_type, ci, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  l3emu::enqueue(handle->stream, [=] {
    for (int i = 0; i < batch; ++i) {
      void* ci = const_cast<char*>(at(c_type, c, stride_c * i));
      gemm(true, ta, tb, m, n, k, al, a_type, at(a_type, a, stride_a * i), lda, b_type,
           at(b_type, b, stride_b * i), ldb, be, c_type, ci, ldc, c_type, ci, ldc);
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

std::size_t cublasLtGetVersion() { return CUBLAS_VERSION; }
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  *desc = new cublasLtMatmulDescOpaque_t{};
  const Desc d{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N,
               compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F};
  std::memcpy((*desc)->data, &d, sizeof(d));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attribute,
                                              const void* buffer, std::size_t bytes) {
  Desc d{};
  std::memcpy(&d, desc->data, sizeof(d));
  if (attribute == CUBLASLT_MATMUL_DESC_TRANSA && bytes == sizeof(cublasOperation_t)) {
    std::memcpy(&d.trans_a, buffer, bytes);
  } else if (attribute == CUBLASLT_MATMUL_DESC_TRANSB && bytes == sizeof(cublasOperation_t)) {
    std::memcpy(&d.trans_b, buffer, bytes);
  } else {
    d.unsupported = true;  // an epilogue, a bias, scaling modes...: not modelled
  }
  std::memcpy(desc->data, &d, sizeof(d));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque_t{};
  const LayoutDesc l{type, rows, cols, ld};
  std::memcpy((*layout)->data, &l, sizeof(l));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  *preference = new cublasLtMatmulPreferenceOpaque_t{};
  const Alignments defaults{};
  std::memcpy((*preference)->data, &defaults, sizeof(defaults));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  delete preference;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void* buffer, std::size_t bytes) {
  Alignments promised{};
  std::memcpy(&promised, preference->data, sizeof(promised));
  std::uint64_t* target = nullptr;
  switch (attribute) {
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      target = &promised.a;
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      target = &promised.b;
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      target = &promised.c;
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      target = &promised.d;
      break;
    default:
      return CUBLAS_STATUS_SUCCESS;  // workspace limit and the like: nothing to model
  }
  // cuBLASLt takes these as uint32_t.
  if (bytes != sizeof(std::uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  std::uint32_t value = 0;
  std::memcpy(&value, buffer, sizeof(value));
  *target = value;
  std::memcpy(preference->data, &promised, sizeof(promised));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t /*handle*/, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t /*a*/,
    cublasLtMatrixLayout_t /*b*/, cublasLtMatrixLayout_t /*c*/, cublasLtMatrixLayout_t /*d*/,
    cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  Desc d{};
  std::memcpy(&d, desc->data, sizeof(d));
  *returned = 0;
  if (d.unsupported) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (requested > 0) {
    results[0] = cublasLtMatmulHeuristicResult_t{};
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0F;
    Alignments needed{};  // without a preference, the defaults
    if (preference != nullptr) std::memcpy(&needed, preference->data, sizeof(needed));
    std::memcpy(results[0].algo.data, &needed, sizeof(needed));
    *returned = 1;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t /*handle*/, cublasLtMatmulDesc_t desc,
                              const void* alpha, const void* a, cublasLtMatrixLayout_t a_layout,
                              const void* b, cublasLtMatrixLayout_t b_layout, const void* beta,
                              const void* c, cublasLtMatrixLayout_t c_layout, void* d,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                              void* /*workspace*/, std::size_t /*workspace_bytes*/,
                              cudaStream_t stream) {
  Desc op{};
  std::memcpy(&op, desc->data, sizeof(op));
  if (op.unsupported) return CUBLAS_STATUS_NOT_SUPPORTED;
  LayoutDesc la{}, lb{}, lc{}, ld{};
  std::memcpy(&la, a_layout->data, sizeof(la));
  std::memcpy(&lb, b_layout->data, sizeof(lb));
  std::memcpy(&lc, c_layout->data, sizeof(lc));
  std::memcpy(&ld, d_layout->data, sizeof(ld));
  // An algorithm from the heuristic needs what its preference promised, of the pointer and of the
  // leading dimension in bytes (CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_*); without one (nullptr),
  // cuBLASLt runs its own query, which sees the pointers.
  if (algo != nullptr) {
    Alignments needed{};
    std::memcpy(&needed, algo->data, sizeof(needed));
    const auto fits = [](const void* pointer, const LayoutDesc& layout, std::uint64_t bytes) {
      const auto element = static_cast<std::uint64_t>(layout.type == CUDA_R_32F ? 4 : 2);
      return aligned(pointer, bytes) && (static_cast<std::uint64_t>(layout.ld) * element) %
                                                std::max<std::uint64_t>(bytes, 1) ==
                                            0;
    };
    if (!fits(a, la, needed.a) || !fits(b, lb, needed.b) || !fits(c, lc, needed.c) ||
        !fits(d, ld, needed.d)) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  const bool ta = op.trans_a == CUBLAS_OP_T;
  const bool tb = op.trans_b == CUBLAS_OP_T;
  const auto m = static_cast<std::int64_t>(ta ? la.cols : la.rows);
  const auto k = static_cast<std::int64_t>(ta ? la.rows : la.cols);
  const auto n = static_cast<std::int64_t>(tb ? lb.rows : lb.cols);
  const auto k_b = static_cast<std::int64_t>(tb ? lb.cols : lb.rows);
  if (k != k_b || static_cast<std::int64_t>(ld.rows) != m ||
      static_cast<std::int64_t>(ld.cols) != n || lc.rows != ld.rows || lc.cols != ld.cols) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const float al = *static_cast<const float*>(alpha);  // host pointers: read at the call
  const float be = *static_cast<const float*>(beta);
  const cublasStatus_t checked = gemm(false, op.trans_a, op.trans_b, m, n, k, al, la.type, a, la.ld,
                                      lb.type, b, lb.ld, be, lc.type, c, lc.ld, ld.type, d, ld.ld);
  if (checked != CUBLAS_STATUS_SUCCESS) return checked;
  l3emu::enqueue(stream, [=] {
    gemm(true, op.trans_a, op.trans_b, m, n, k, al, la.type, a, la.ld, lb.type, b, lb.ld, be,
         lc.type, c, lc.ld, ld.type, d, ld.ld);
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
