#include "kernels/cuda/cuda_ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "kernels/cuda/carver.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/input_stager.hpp"
#include "kernels/cuda/lt_matmul.hpp"
#include "kernels/cuda/scratch_sizes.hpp"

namespace l3::cuda {

using kernels::BFloat16;
using kernels::DType;
using kernels::TensorView;

namespace {

template <typename T>
const T* in(TensorView x, std::int64_t count, std::string_view op, std::string_view name) {
  if (x.numel() < count) {
    throw core::internal_error(
        fmt::format("cuda {}: '{}' has {} elements, needs {}", op, name, x.numel(), count));
  }
  return x.as<const T>().data();
}
template <typename T>
T* out(TensorView x, std::int64_t count, std::string_view op, std::string_view name) {
  return const_cast<T*>(in<T>(x, count, op, name));  // NOLINT: views are untyped memory
}

// A weight gradient, bf16 or fp32 (--grad-accum-dtype fp32): `add` gets the typed pointer.
template <typename Add>
void add_to_gradient(TensorView dw, std::int64_t count, std::string_view op, Add add) {
  if (dw.dtype() == DType::f32) {
    add(out<float>(dw, count, op, "dw"));
  } else {
    add(out<BFloat16>(dw, count, op, "dw"));
  }
}

// C (rows x cols) = alpha op(A) op(B) + beta C with bf16 operands (see RowMajorGemm).
RowMajorGemm gemm(std::int64_t rows, std::int64_t cols, std::int64_t inner, const void* a,
                  std::int64_t lda, bool transpose_a, const void* b, std::int64_t ldb,
                  bool transpose_b, void* c, std::int64_t ldc, float beta,
                  DType c_type = DType::bf16) {
  RowMajorGemm g;
  g.rows = rows;
  g.cols = cols;
  g.inner = inner;
  g.a = a;
  g.lda = lda;
  g.transpose_a = transpose_a;
  g.b = b;
  g.ldb = ldb;
  g.transpose_b = transpose_b;
  g.c = c;
  g.ldc = ldc;
  g.c_type = c_type;
  g.beta = beta;
  return g;
}

}  // namespace

DeviceScratch::~DeviceScratch() { cudaFree(data_); }

void* DeviceScratch::get(std::size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_) return data_;
  check(cudaStreamSynchronize(stream), "scratch: wait before growing");
  check(cudaFree(data_), "scratch: free");
  data_ = nullptr;
  bytes_ = 0;
  check(cudaMalloc(&data_, bytes), fmt::format("scratch: cudaMalloc of {} bytes", bytes));
  bytes_ = bytes;
  return data_;
}

CudaOps::CudaOps(CudaOptions options) {
  const int device = options.device;
  if (options.cudnn_attention) {
    cudnn_ = std::make_unique<CudnnAttention>(
        CudnnAttentionOptions{.deterministic = options.deterministic});
  }
  if (device < 0) {
    check(cudaGetDevice(&device_), "cudaGetDevice");
  } else {
    device_ = device;
    check(cudaSetDevice(device_), fmt::format("cudaSetDevice({})", device_));
  }
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cublasCreate(&cublas_), "cublasCreate");
  check(cublasSetStream(cublas_, stream_), "cublasSetStream");
  lt_ = std::make_unique<LtMatmul>();
}

CudaOps::~CudaOps() {
  cudaStreamSynchronize(stream_);
  inputs_.reset();
  cudnn_.reset();
  lt_.reset();
  cublasDestroy(cublas_);
  cudaStreamDestroy(stream_);
}

kernels::Buffer CudaOps::allocate(DType dtype, std::int64_t numel) {
  return allocate_device(dtype, numel);
}

void CudaOps::upload_inputs(int set, std::span<const kernels::HostUpload> uploads) {
  if (!inputs_) inputs_ = std::make_unique<InputStager>(stream_);
  inputs_->upload(set, uploads);
}

double CudaOps::take_input_wait_ms() { return inputs_ ? inputs_->take_wait_ms() : 0.0; }

void CudaOps::zero(TensorView x) {
  check(cudaMemsetAsync(x.data(), 0, x.bytes(), stream_), "zero");
}

std::string CudaOps::report() const {
  if (!cudnn_) return {};
  std::string text = fmt::format("attention: {} calls on cuDNN, {} on the fallback",
                                 attention_.cudnn, attention_.fallback);
  if (!attention_.last_declined.empty())
    text += fmt::format(" (cuDNN declined: {})", attention_.last_declined);
  return text;
}

std::int64_t CudaOps::memory_capacity() const {
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device_) check(cudaSetDevice(device_), fmt::format("cudaSetDevice({})", device_));
  std::size_t free = 0;
  std::size_t total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  if (current != device_) check(cudaSetDevice(current), fmt::format("cudaSetDevice({})", current));
  return static_cast<std::int64_t>(total);
}

void CudaOps::bind_thread() {
  check(cudaSetDevice(device_), fmt::format("cudaSetDevice({}) for the calling thread", device_));
}

void CudaOps::synchronize() {
  if (!wait_check_) {
    check(cudaStreamSynchronize(stream_), "synchronize");
    return;
  }
  for (;;) {
    const cudaError_t status = cudaStreamQuery(stream_);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check(status, "synchronize");
    wait_check_();
    // A short nap: a step waits here a few times, and each wait costs at most this much more.
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void CudaOps::copy(TensorView dst, TensorView src) {
  if (dst.numel() != src.numel()) {
    throw core::internal_error(
        fmt::format("cuda copy: {} elements into {}", src.numel(), dst.numel()));
  }
  const std::int64_t n = src.numel();
  const bool dst_device = is_device_pointer(dst.data());
  const bool src_device = is_device_pointer(src.data());
  if (dst.dtype() == src.dtype()) {
    if (dst_device && !src_device && uploads_.upload(dst.data(), src.data(), src.bytes(), stream_))
      return;  // staged through pinned memory: no synchronisation
    check(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDefault, stream_), "copy");
    if (!dst_device || !src_device) synchronize();  // host memory is the caller's once we return
    return;
  }
  const bool to_bf16 = src.dtype() == DType::f32 && dst.dtype() == DType::bf16;
  const bool to_f32 = src.dtype() == DType::bf16 && dst.dtype() == DType::f32;
  if (!to_bf16 && !to_f32) {
    throw core::internal_error(fmt::format("cuda copy: no conversion from {} to {}",
                                           kernels::dtype_name(src.dtype()),
                                           kernels::dtype_name(dst.dtype())));
  }
  // Convert on the device. Host sides go through device staging a chunk at a time, so that
  // converting a whole model (initial weights, an import) needs tens of MB of scratch rather
  // than 6 bytes per parameter.
  auto cast = [&](void* to, const void* from, std::int64_t count) {
    if (to_bf16) {
      cast_f32_to_bf16(static_cast<BFloat16*>(to), static_cast<const float*>(from), count, stream_);
    } else {
      cast_bf16_to_f32(static_cast<float*>(to), static_cast<const BFloat16*>(from), count, stream_);
    }
  };
  if (dst_device && src_device) {
    cast(dst.data(), src.data(), n);
    return;
  }
  const std::size_t src_size = kernels::dtype_size(src.dtype());
  const std::size_t dst_size = kernels::dtype_size(dst.dtype());
  const std::int64_t chunk = std::min<std::int64_t>(n, kCopyChunkElements);
  Carver carve;
  const std::size_t staged_src = carve.reserve_bytes(static_cast<std::size_t>(chunk) * src_size);
  const std::size_t staged_dst = carve.reserve_bytes(static_cast<std::size_t>(chunk) * dst_size);
  void* base = scratch_.get(carve.total(), stream_);
  for (std::int64_t first = 0; first < n; first += chunk) {
    const std::int64_t count = std::min(chunk, n - first);
    const auto offset = static_cast<std::size_t>(first);
    const auto* src_at = static_cast<const char*>(src.data()) + offset * src_size;
    auto* dst_at = static_cast<char*>(dst.data()) + offset * dst_size;
    const void* device_src = src_at;
    if (!src_device) {
      check(cudaMemcpyAsync(at<char>(base, staged_src), src_at,
                            static_cast<std::size_t>(count) * src_size, cudaMemcpyHostToDevice,
                            stream_),
            "copy: upload");
      device_src = at<char>(base, staged_src);
    }
    void* device_dst = dst_device ? static_cast<void*>(dst_at) : at<char>(base, staged_dst);
    cast(device_dst, device_src, count);
    if (!dst_device) {
      check(cudaMemcpyAsync(dst_at, device_dst, static_cast<std::size_t>(count) * dst_size,
                            cudaMemcpyDeviceToHost, stream_),
            "copy: download");
    }
  }
  synchronize();  // host memory is the caller's once we return
}

void CudaOps::matmul(TensorView y, TensorView x, TensorView w, std::int64_t m, std::int64_t n,
                     std::int64_t k, bool accumulate) {
  if (y.numel() < m * n) throw core::internal_error("cuda matmul: y too small");
  // y (m, n) = x (m, k) W^T, W (n, k)
  lt_->run(gemm(m, n, k, in<BFloat16>(x, m * k, "matmul", "x"), k, false,
                in<BFloat16>(w, n * k, "matmul", "w"), k, true, y.data(), n,
                accumulate ? 1.0F : 0.0F, y.dtype()),
           stream_);
}

void CudaOps::matmul_backward(TensorView dx, TensorView dw, TensorView dy, TensorView x,
                              TensorView w, std::int64_t m, std::int64_t n, std::int64_t k,
                              bool accumulate_dx) {
  const auto* dy_data = in<BFloat16>(dy, m * n, "matmul_backward", "dy");
  if (!dx.empty()) {  // dx (m, k) = dy (m, n) W (n, k)
    lt_->run(
        gemm(m, k, n, dy_data, n, false, in<BFloat16>(w, n * k, "matmul_backward", "w"), k, false,
             out<BFloat16>(dx, m * k, "matmul_backward", "dx"), k, accumulate_dx ? 1.0F : 0.0F),
        stream_);
  }
  if (!dw.empty()) {  // dw (n, k) += dy^T (n, m) x (m, k), in dw's dtype
    const auto* x_data = in<BFloat16>(x, m * k, "matmul_backward", "x");
    add_to_gradient(dw, n * k, "matmul_backward", [&](auto* dw_data) {
      lt_->run(gemm(n, k, m, dy_data, n, true, x_data, k, false, dw_data, k, 1.0F, dw.dtype()),
               stream_);
    });
  }
}

void CudaOps::embedding(TensorView out_view, TensorView tokens, TensorView table, std::int64_t n,
                        std::int64_t hidden) {
  embedding_forward(out<BFloat16>(out_view, n * hidden, "embedding", "out"),
                    in<std::int32_t>(tokens, n, "embedding", "tokens"),
                    table.as<const BFloat16>().data(), n, hidden, table.numel() / hidden, stream_);
}

void CudaOps::embedding_backward(TensorView dtable, TensorView tokens, TensorView dout,
                                 std::int64_t n, std::int64_t hidden) {
  const std::size_t bytes = embedding_backward_workspace(n, hidden);
  void* workspace = scratch_.get(bytes, stream_);
  const auto* token_data = in<std::int32_t>(tokens, n, "embedding_backward", "tokens");
  const auto* dout_data = in<BFloat16>(dout, n * hidden, "embedding_backward", "dout");
  // The table's rows are the token ids (validated on the host): all of dtable may be written.
  add_to_gradient(dtable, dtable.numel(), "embedding_backward", [&](auto* dtable_data) {
    cuda::embedding_backward(dtable_data, token_data, dout_data, n, hidden, workspace, bytes,
                             stream_);
  });
}

void CudaOps::rmsnorm(TensorView out_view, TensorView rstd, TensorView x, TensorView w,
                      std::int64_t rows, std::int64_t hidden, float eps) {
  rmsnorm_forward(out<BFloat16>(out_view, rows * hidden, "rmsnorm", "out"),
                  out<float>(rstd, rows, "rmsnorm", "rstd"),
                  in<BFloat16>(x, rows * hidden, "rmsnorm", "x"),
                  in<BFloat16>(w, hidden, "rmsnorm", "w"), rows, hidden, eps, stream_);
}

void CudaOps::rmsnorm_backward(TensorView dx, TensorView dw, TensorView dout, TensorView x,
                               TensorView w, TensorView rstd, std::int64_t rows,
                               std::int64_t hidden) {
  auto* partials = static_cast<float*>(scratch_.get(
      static_cast<std::size_t>(rmsnorm_partials(rows, hidden)) * sizeof(float), stream_));
  add_to_gradient(dw, hidden, "rmsnorm_backward", [&](auto* dw_data) {
    cuda::rmsnorm_backward(out<BFloat16>(dx, rows * hidden, "rmsnorm_backward", "dx"), dw_data,
                           in<BFloat16>(dout, rows * hidden, "rmsnorm_backward", "dout"),
                           in<BFloat16>(x, rows * hidden, "rmsnorm_backward", "x"),
                           in<BFloat16>(w, hidden, "rmsnorm_backward", "w"),
                           in<float>(rstd, rows, "rmsnorm_backward", "rstd"), rows, hidden,
                           partials, stream_);
  });
}

void CudaOps::rope(TensorView x, TensorView positions, TensorView cos, TensorView sin,
                   std::int64_t n, int heads, int head_dim) {
  cuda::rope(out<BFloat16>(x, n * heads * head_dim, "rope", "x"),
             in<std::int32_t>(positions, n, "rope", "positions"), cos.as<const float>().data(),
             sin.as<const float>().data(), n, heads, head_dim, 1.0F, stream_);
}

void CudaOps::rope_backward(TensorView dx, TensorView positions, TensorView cos, TensorView sin,
                            std::int64_t n, int heads, int head_dim) {
  cuda::rope(out<BFloat16>(dx, n * heads * head_dim, "rope_backward", "dx"),
             in<std::int32_t>(positions, n, "rope_backward", "positions"),
             cos.as<const float>().data(), sin.as<const float>().data(), n, heads, head_dim, -1.0F,
             stream_);
}

std::vector<std::int32_t> CudaOps::download_segments(TensorView cu_seqlens,
                                                     const kernels::AttentionShape& shape) {
  const int segments = shape.n_segments;
  if (!shape.host_cu_seqlens.empty()) {
    if (shape.host_cu_seqlens.size() != static_cast<std::size_t>(segments) + 1) {
      throw core::internal_error(fmt::format("attention: {} host cu_seqlens for {} segments",
                                             shape.host_cu_seqlens.size(), segments));
    }
    return {shape.host_cu_seqlens.begin(), shape.host_cu_seqlens.end()};
  }
  std::vector<std::int32_t> host(static_cast<std::size_t>(segments) + 1);
  check(cudaMemcpyAsync(host.data(),
                        in<std::int32_t>(cu_seqlens, segments + 1, "attention", "cu_seqlens"),
                        host.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_),
        "attention: download cu_seqlens");
  synchronize();
  return host;
}

namespace {

// One strided-batched GEMM of the fallback attention, in cuBLAS's column-major terms.
struct BatchedGemm {
  cublasOperation_t op_a, op_b;
  int m, n, k;
  const void* a;
  cudaDataType a_type;
  int lda;
  long long stride_a;
  const void* b;
  cudaDataType b_type;
  int ldb;
  long long stride_b;
  void* c;
  cudaDataType c_type;
  int ldc;
  long long stride_c;
  int batch;
  float alpha;
  float beta;
};

void run(cublasHandle_t handle, const BatchedGemm& g, std::string_view what) {
  check(cublasGemmStridedBatchedEx(handle, g.op_a, g.op_b, g.m, g.n, g.k, &g.alpha, g.a, g.a_type,
                                   g.lda, g.stride_a, g.b, g.b_type, g.ldb, g.stride_b, &g.beta,
                                   g.c, g.c_type, g.ldc, g.stride_c, g.batch, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
        fmt::format("attention {}: batched GEMM m={} n={} k={} batch={}", what, g.m, g.n, g.k,
                    g.batch));
}

}  // namespace

// Scores of a segment [a, a + L), for the heads h = g * group + j (g over KV heads): the
// column-major (L keys x L queries) matrix of key . query, i.e. row-major scores[query][key].
void CudaOps::attention(TensorView out_view, TensorView lse, TensorView q, TensorView k,
                        TensorView v, TensorView cu_seqlens, const kernels::AttentionShape& shape) {
  if (cudnn_) {
    if (cudnn_->forward(out_view, lse, q, k, v, cu_seqlens, shape, shape.host_cu_seqlens,
                        stream_)) {
      ++attention_.cudnn;
      return;
    }
    ++attention_.fallback;
    attention_.last_declined = cudnn_->last_unsupported_reason();
  }
  const std::int64_t n = shape.tokens;
  const int hd = shape.head_dim;
  const int group = shape.n_heads / shape.n_kv_heads;
  const int qs = shape.n_heads * hd;      // row stride of q and out
  const int kvs = shape.n_kv_heads * hd;  // row stride of k and v
  const auto* qd = in<BFloat16>(q, n * qs, "attention", "q");
  const auto* kd = in<BFloat16>(k, n * kvs, "attention", "k");
  const auto* vd = in<BFloat16>(v, n * kvs, "attention", "v");
  auto* od = out<BFloat16>(out_view, n * qs, "attention", "out");
  auto* lsed = out<float>(lse, n * shape.n_heads, "attention", "lse");
  const std::vector<std::int32_t> cu = download_segments(cu_seqlens, shape);
  const std::int64_t longest = shape.max_segment;
  Carver carve;
  const std::size_t scores_at = carve.reserve<float>(shape.n_kv_heads * longest * longest);
  const std::size_t probs_at = carve.reserve<BFloat16>(shape.n_kv_heads * longest * longest);
  void* base = scratch_.get(carve.total(), stream_);
  auto* scores = at<float>(base, scores_at);
  auto* probs = at<BFloat16>(base, probs_at);
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  for (int s = 0; s < shape.n_segments; ++s) {
    const std::int64_t a = cu[static_cast<std::size_t>(s)];
    const int length = cu[static_cast<std::size_t>(s) + 1] - cu[static_cast<std::size_t>(s)];
    if (length == 0) continue;
    const long long square = static_cast<long long>(length) * length;
    for (int j = 0; j < group; ++j) {
      run(cublas_,
          {CUBLAS_OP_T,
           CUBLAS_OP_N,
           length,
           length,
           hd,
           kd + a * kvs,
           CUDA_R_16BF,
           kvs,
           hd,
           qd + a * qs + j * hd,
           CUDA_R_16BF,
           qs,
           static_cast<long long>(group) * hd,
           scores,
           CUDA_R_32F,
           length,
           square,
           shape.n_kv_heads,
           scale,
           0.0F},
          "forward scores");
      causal_softmax(probs, lsed + a + j * n, scores, shape.n_kv_heads, length, group * n, stream_);
      run(cublas_,
          {CUBLAS_OP_N,
           CUBLAS_OP_N,
           hd,
           length,
           length,
           vd + a * kvs,
           CUDA_R_16BF,
           kvs,
           hd,
           probs,
           CUDA_R_16BF,
           length,
           square,
           od + a * qs + j * hd,
           CUDA_R_16BF,
           qs,
           static_cast<long long>(group) * hd,
           shape.n_kv_heads,
           1.0F,
           0.0F},
          "forward output");
    }
  }
}

void CudaOps::attention_backward(TensorView dq, TensorView dk, TensorView dv, TensorView dout,
                                 TensorView out_view, TensorView lse, TensorView q, TensorView k,
                                 TensorView v, TensorView cu_seqlens,
                                 const kernels::AttentionShape& shape) {
  if (cudnn_) {
    if (cudnn_->backward(dq, dk, dv, dout, out_view, lse, q, k, v, cu_seqlens, shape,
                         shape.host_cu_seqlens, stream_)) {
      ++attention_.cudnn;
      return;
    }
    ++attention_.fallback;
    attention_.last_declined = cudnn_->last_unsupported_reason();
  }
  const std::int64_t n = shape.tokens;
  const int hd = shape.head_dim;
  const int group = shape.n_heads / shape.n_kv_heads;
  const int qs = shape.n_heads * hd;
  const int kvs = shape.n_kv_heads * hd;
  const auto* qd = in<BFloat16>(q, n * qs, "attention_backward", "q");
  const auto* kd = in<BFloat16>(k, n * kvs, "attention_backward", "k");
  const auto* vd = in<BFloat16>(v, n * kvs, "attention_backward", "v");
  const auto* od = in<BFloat16>(out_view, n * qs, "attention_backward", "out");
  const auto* dod = in<BFloat16>(dout, n * qs, "attention_backward", "dout");
  const auto* lsed = in<float>(lse, n * shape.n_heads, "attention_backward", "lse");
  auto* dqd = out<BFloat16>(dq, n * qs, "attention_backward", "dq");
  auto* dkd = out<BFloat16>(dk, n * kvs, "attention_backward", "dk");
  auto* dvd = out<BFloat16>(dv, n * kvs, "attention_backward", "dv");
  const std::vector<std::int32_t> cu = download_segments(cu_seqlens, shape);
  const std::int64_t longest = shape.max_segment;
  const std::int64_t squares = shape.n_kv_heads * longest * longest;
  Carver carve;
  const std::size_t scores_at = carve.reserve<float>(squares);
  const std::size_t probs_at = carve.reserve<BFloat16>(squares);
  const std::size_t dprobs_at = carve.reserve<float>(squares);
  const std::size_t dscores_at = carve.reserve<BFloat16>(squares);
  const std::size_t dot_at = carve.reserve<float>(shape.n_heads * longest);
  const std::size_t dk_at = carve.reserve<float>(longest * kvs);
  const std::size_t dv_at = carve.reserve<float>(longest * kvs);
  void* base = scratch_.get(carve.total(), stream_);
  auto* scores = at<float>(base, scores_at);
  auto* probs = at<BFloat16>(base, probs_at);
  auto* dprobs = at<float>(base, dprobs_at);
  auto* dscores = at<BFloat16>(base, dscores_at);
  auto* dot = at<float>(base, dot_at);
  auto* dk_acc = at<float>(base, dk_at);
  auto* dv_acc = at<float>(base, dv_at);
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const long long group_stride = static_cast<long long>(group) * hd;

  for (int s = 0; s < shape.n_segments; ++s) {
    const std::int64_t a = cu[static_cast<std::size_t>(s)];
    const int length = cu[static_cast<std::size_t>(s) + 1] - cu[static_cast<std::size_t>(s)];
    if (length == 0) continue;
    const long long square = static_cast<long long>(length) * length;
    check(
        cudaMemsetAsync(dk_acc, 0, static_cast<std::size_t>(length) * kvs * sizeof(float), stream_),
        "attention backward: zero dk");
    check(
        cudaMemsetAsync(dv_acc, 0, static_cast<std::size_t>(length) * kvs * sizeof(float), stream_),
        "attention backward: zero dv");
    attention_row_dot(dot, dod + a * qs, od + a * qs, shape.n_heads, length, hd, stream_);
    for (int j = 0; j < group; ++j) {
      const BFloat16* q_j = qd + a * qs + j * hd;
      const BFloat16* do_j = dod + a * qs + j * hd;
      run(cublas_,
          {CUBLAS_OP_T, CUBLAS_OP_N, length, length,           hd,    kd + a * kvs, CUDA_R_16BF,
           kvs,         hd,          q_j,    CUDA_R_16BF,      qs,    group_stride, scores,
           CUDA_R_32F,  length,      square, shape.n_kv_heads, scale, 0.0F},
          "backward scores");
      causal_probs(probs, scores, lsed + a + j * n, shape.n_kv_heads, length, group * n, stream_);
      // dv (L keys x hd) += P^T dO
      run(cublas_, {CUBLAS_OP_N, CUBLAS_OP_T,  hd,    length,           length, do_j,   CUDA_R_16BF,
                    qs,          group_stride, probs, CUDA_R_16BF,      length, square, dv_acc,
                    CUDA_R_32F,  kvs,          hd,    shape.n_kv_heads, 1.0F,   1.0F},
          "backward dv");
      // dP (queries x keys) = dO V^T
      run(cublas_,
          {CUBLAS_OP_T, CUBLAS_OP_N, length, length,           hd,   vd + a * kvs, CUDA_R_16BF,
           kvs,         hd,          do_j,   CUDA_R_16BF,      qs,   group_stride, dprobs,
           CUDA_R_32F,  length,      square, shape.n_kv_heads, 1.0F, 0.0F},
          "backward dP");
      attention_dscores(dscores, probs, dprobs, dot + static_cast<std::int64_t>(j) * length,
                        static_cast<std::int64_t>(group) * length, shape.n_kv_heads, length, scale,
                        stream_);
      // dq = dS K
      run(cublas_, {CUBLAS_OP_N,  CUBLAS_OP_N,
                    hd,           length,
                    length,       kd + a * kvs,
                    CUDA_R_16BF,  kvs,
                    hd,           dscores,
                    CUDA_R_16BF,  length,
                    square,       dqd + a * qs + j * hd,
                    CUDA_R_16BF,  qs,
                    group_stride, shape.n_kv_heads,
                    1.0F,         0.0F},
          "backward dq");
      // dk += dS^T Q
      run(cublas_,
          {CUBLAS_OP_N, CUBLAS_OP_T,  hd,      length,           length, q_j,    CUDA_R_16BF,
           qs,          group_stride, dscores, CUDA_R_16BF,      length, square, dk_acc,
           CUDA_R_32F,  kvs,          hd,      shape.n_kv_heads, 1.0F,   1.0F},
          "backward dk");
    }
    cast_f32_to_bf16(dkd + a * kvs, dk_acc, static_cast<std::int64_t>(length) * kvs, stream_);
    cast_f32_to_bf16(dvd + a * kvs, dv_acc, static_cast<std::int64_t>(length) * kvs, stream_);
  }
}

void CudaOps::swiglu(TensorView out_view, TensorView gate, TensorView up, std::int64_t n) {
  swiglu_forward(out<BFloat16>(out_view, n, "swiglu", "out"),
                 in<BFloat16>(gate, n, "swiglu", "gate"), in<BFloat16>(up, n, "swiglu", "up"), n,
                 stream_);
}

void CudaOps::swiglu_backward(TensorView dgate, TensorView dup, TensorView dout, TensorView gate,
                              TensorView up, std::int64_t n) {
  cuda::swiglu_backward(out<BFloat16>(dgate, n, "swiglu_backward", "dgate"),
                        out<BFloat16>(dup, n, "swiglu_backward", "dup"),
                        in<BFloat16>(dout, n, "swiglu_backward", "dout"),
                        in<BFloat16>(gate, n, "swiglu_backward", "gate"),
                        in<BFloat16>(up, n, "swiglu_backward", "up"), n, stream_);
}

void CudaOps::add_into(TensorView dst, TensorView src, std::int64_t n) {
  const auto* from = in<BFloat16>(src, n, "add_into", "src");
  if (dst.dtype() == DType::f32) {
    cuda::add_into(out<float>(dst, n, "add_into", "dst"), from, n, stream_);
  } else {
    cuda::add_into(out<BFloat16>(dst, n, "add_into", "dst"), from, n, stream_);
  }
}

double CudaOps::sum_squares(TensorView x, std::int64_t n) {
  Carver carve;
  const std::size_t partials_at = carve.reserve<double>(kSumSquaresBlocks);
  const std::size_t result_at = carve.reserve<double>(1);
  void* base = scratch_.get(carve.total(), stream_);
  if (x.dtype() == DType::f32) {
    sum_squares_f32(at<double>(base, result_at), in<float>(x, n, "sum_squares", "x"), n,
                    at<double>(base, partials_at), stream_);
  } else {
    cuda::sum_squares(at<double>(base, result_at), in<BFloat16>(x, n, "sum_squares", "x"), n,
                      at<double>(base, partials_at), stream_);
  }
  double result = 0.0;
  check(cudaMemcpyAsync(&result, at<double>(base, result_at), sizeof(double),
                        cudaMemcpyDeviceToHost, stream_),
        "sum_squares: download");
  synchronize();
  return result;
}

void CudaOps::sum_squares_each(std::span<const TensorView> xs, std::span<double> out) {
  if (xs.empty()) return;
  Carver carve;
  const std::size_t partials_at = carve.reserve<double>(kSumSquaresBlocks);
  const std::size_t results_at = carve.reserve<double>(static_cast<std::int64_t>(xs.size()));
  void* base = scratch_.get(carve.total(), stream_);
  // The partials are reused piece after piece: the kernels run in stream order.
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const TensorView x = xs[i];
    double* result = at<double>(base, results_at) + i;
    if (x.dtype() == DType::f32) {
      sum_squares_f32(result, in<float>(x, x.numel(), "sum_squares_each", "x"), x.numel(),
                      at<double>(base, partials_at), stream_);
    } else {
      cuda::sum_squares(result, in<BFloat16>(x, x.numel(), "sum_squares_each", "x"), x.numel(),
                        at<double>(base, partials_at), stream_);
    }
  }
  check(cudaMemcpyAsync(out.data(), at<double>(base, results_at), xs.size() * sizeof(double),
                        cudaMemcpyDeviceToHost, stream_),
        fmt::format("sum_squares_each: download of {} sums", xs.size()));
  synchronize();
}

void CudaOps::lm_head_cross_entropy(TensorView loss_sum, TensorView dh, TensorView dw, TensorView h,
                                    TensorView w, TensorView rows, TensorView targets,
                                    std::int64_t n, std::int64_t counted, std::int64_t vocab,
                                    std::int64_t hidden, float grad_scale) {
  const bool backward = !dh.empty();
  auto* sum = out<double>(loss_sum, 1, "lm_head_cross_entropy", "loss_sum");
  const auto* hd = in<BFloat16>(h, n * hidden, "lm_head_cross_entropy", "h");
  const auto* wd = in<BFloat16>(w, vocab * hidden, "lm_head_cross_entropy", "w");
  const auto* rd = in<std::int32_t>(rows, counted, "lm_head_cross_entropy", "rows");
  const auto* td = in<std::int32_t>(targets, counted, "lm_head_cross_entropy", "targets");
  if (backward) {
    if (dw.numel() < vocab * hidden) throw core::internal_error("cuda lm_head: dw too small");
    zero(dh.slice(0, n * hidden));
  }
  if (counted == 0) return;

  Carver carve;
  const LmHeadScratch layout = carve_lm_head(carve, counted, vocab, hidden, backward);
  void* base = scratch_.get(carve.total(), stream_);
  auto* losses = at<float>(base, layout.losses);
  auto* hb = at<BFloat16>(base, layout.hb);
  auto* dhb = at<BFloat16>(base, layout.dhb);
  auto* logits = at<float>(base, layout.logits);
  auto* dlogits = backward ? at<BFloat16>(base, layout.dlogits) : nullptr;
  for (std::int64_t begin = 0; begin < counted; begin += layout.block) {
    const std::int64_t block = std::min<std::int64_t>(layout.block, counted - begin);
    gather_rows(hb, hd, rd + begin, block, hidden, stream_);
    // logits (block, V) = hb (block, H) w^T, in fp32
    lt_->run(gemm(block, vocab, hidden, hb, hidden, false, wd, hidden, true, logits, vocab, 0.0F,
                  DType::f32),
             stream_);
    softmax_cross_entropy(losses + begin, dlogits, logits, td + begin, block, vocab, grad_scale,
                          stream_);
    if (!backward) continue;
    // dhb (block, H) = dlogits (block, V) w (V, H), then into dh's counted rows
    lt_->run(
        gemm(block, hidden, vocab, dlogits, vocab, false, wd, hidden, false, dhb, hidden, 0.0F),
        stream_);
    scatter_rows(out<BFloat16>(dh, n * hidden, "lm_head_cross_entropy", "dh"), dhb, rd + begin,
                 block, hidden, stream_);
    // dw (V, H) += dlogits^T (V, block) hb (block, H)
    add_to_gradient(dw, vocab * hidden, "lm_head_cross_entropy", [&](auto* dw_data) {
      lt_->run(gemm(vocab, hidden, block, dlogits, vocab, true, hb, hidden, false, dw_data, hidden,
                    1.0F, dw.dtype()),
               stream_);
    });
  }
  add_sum_f32(sum, losses, counted, stream_);  // stays on the device: no synchronisation
}

void CudaOps::bradley_terry(TensorView sums, TensorView d_scores, TensorView scores,
                            TensorView margins, std::int64_t pairs, double center,
                            float grad_scale) {
  cuda::bradley_terry(
      out<double>(sums, 3, "bradley_terry", "sums"),
      d_scores.empty() ? nullptr : out<float>(d_scores, 2 * pairs, "bradley_terry", "d_scores"),
      in<float>(scores, 2 * pairs, "bradley_terry", "scores"),
      margins.empty() ? nullptr : in<float>(margins, pairs, "bradley_terry", "margins"), pairs,
      center, grad_scale, stream_);
}

void CudaOps::gather_dot(TensorView scores, TensorView h, TensorView w, TensorView rows,
                         std::int64_t count, std::int64_t hidden) {
  cuda::gather_dot(out<float>(scores, count, "gather_dot", "scores"), h.as<const BFloat16>().data(),
                   in<BFloat16>(w, hidden, "gather_dot", "w"),
                   in<std::int32_t>(rows, count, "gather_dot", "rows"), count, hidden, stream_);
}

void CudaOps::gather_dot_backward(TensorView dh, TensorView dw, TensorView dscores, TensorView h,
                                  TensorView w, TensorView rows, std::int64_t count,
                                  std::int64_t hidden) {
  add_to_gradient(dw, hidden, "gather_dot_backward", [&](auto* dw_data) {
    cuda::gather_dot_backward(
        dh.as<BFloat16>().data(), dw_data,
        in<float>(dscores, count, "gather_dot_backward", "dscores"), h.as<const BFloat16>().data(),
        in<BFloat16>(w, hidden, "gather_dot_backward", "w"),
        in<std::int32_t>(rows, count, "gather_dot_backward", "rows"), count, hidden, stream_);
  });
}

void CudaOps::adamw(TensorView params, TensorView params_copy, TensorView grads, TensorView m,
                    TensorView v, std::int64_t n, const kernels::AdamWParams& hyper) {
  auto* master = out<float>(params, n, "adamw", "params");
  auto* copy =
      params_copy.empty() ? nullptr : out<BFloat16>(params_copy, n, "adamw", "params_copy");
  auto* m1 = out<float>(m, n, "adamw", "m");
  auto* m2 = out<float>(v, n, "adamw", "v");
  if (grads.dtype() == DType::f32) {  // ZeRO-2's accumulated shard
    cuda::adamw(master, copy, in<float>(grads, n, "adamw", "grads"), m1, m2, n, hyper, stream_);
  } else {
    cuda::adamw(master, copy, in<BFloat16>(grads, n, "adamw", "grads"), m1, m2, n, hyper, stream_);
  }
}

}  // namespace l3::cuda
