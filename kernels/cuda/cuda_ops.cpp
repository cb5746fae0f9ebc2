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
#include "kernels/op_shapes.hpp"

namespace l3::cuda {

using kernels::BFloat16;
using kernels::ConstTensorView;
using kernels::DType;
using kernels::TensorView;

namespace {

// The typed device pointers of a view: the element type checked by as<T>(), the sizes by the
// op's shape check (kernels/op_shapes.hpp) before.
template <typename T>
const T* in(ConstTensorView x) {
  return x.as<T>().data();
}
template <typename T>
T* out(TensorView x) {
  return x.as<T>().data();
}

// A weight gradient, bf16 or fp32 (--grad-accum-dtype fp32): `add` gets the typed pointer.
template <typename Add>
void add_to_gradient(TensorView dw, Add add) {
  if (dw.dtype() == DType::f32) {
    add(out<float>(dw));
  } else {
    add(out<BFloat16>(dw));
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
  ++generation_;
  check(cudaMalloc(&data_, bytes), fmt::format("scratch: cudaMalloc of {} bytes", bytes));
  bytes_ = bytes;
  return data_;
}

namespace {

// An instantiated graph of the backend's stream; stale once the scratch buffer it records
// pointers into has been replaced.
class CudaGraph final : public kernels::OpsGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream, const DeviceScratch& scratch)
      : exec_(exec), stream_(stream), scratch_(scratch), generation_(scratch.generation()) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  CudaGraph(CudaGraph&&) = delete;
  CudaGraph& operator=(CudaGraph&&) = delete;

  void replay() override {
    if (!valid()) throw core::internal_error("cuda graph replayed after its scratch was replaced");
    check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
  }
  [[nodiscard]] bool valid() const noexcept override {
    return scratch_.generation() == generation_;
  }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  const DeviceScratch& scratch_;
  std::uint64_t generation_;
};

}  // namespace

std::unique_ptr<kernels::OpsGraph> CudaOps::capture(const std::function<void()>& record) {
  // Thread-local mode: this thread may not make calls that are unsafe in a capture (allocation,
  // synchronisation), which then fail instead of silently breaking the graph.
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
        "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  try {
    record();
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);  // invalidated: nothing to keep
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // the capture's error is reported by the exception
    throw;
  }
  check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(instantiated, "cudaGraphInstantiate");
  return std::make_unique<CudaGraph>(exec, stream_, scratch_);
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
  allocated_ += numel * static_cast<std::int64_t>(kernels::dtype_size(dtype));
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

int CudaOps::add_wait_check(std::function<void()> check) {
  const int key = next_wait_check_++;
  wait_checks_.emplace(key, std::move(check));
  return key;
}

void CudaOps::synchronize() {
  if (wait_checks_.empty()) {
    check(cudaStreamSynchronize(stream_), "synchronize");
    return;
  }
  for (;;) {
    const cudaError_t status = cudaStreamQuery(stream_);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check(status, "synchronize");
    for (const auto& [key, check] : wait_checks_) check();
    // A short nap: a step waits here a few times, and each wait costs at most this much more.
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void CudaOps::copy(TensorView dst, ConstTensorView src) {
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

void CudaOps::matmul(const kernels::MatmulArgs& a) {
  const kernels::MatmulDims d = kernels::matmul_dims(a);
  // y (m, n) = x (m, k) W^T, W (n, k)
  lt_->run(gemm(d.m, d.n, d.k, in<BFloat16>(a.x), d.k, false, in<BFloat16>(a.w), d.k, true,
                a.y.data(), d.n, a.accumulate ? 1.0F : 0.0F, a.y.dtype()),
           stream_);
}

void CudaOps::matmul_backward(const kernels::MatmulBackwardArgs& a) {
  const kernels::MatmulDims d = kernels::matmul_dims(a);
  const auto* dy_data = in<BFloat16>(a.dy);
  if (!a.dx.empty()) {  // dx (m, k) = dy (m, n) W (n, k)
    lt_->run(gemm(d.m, d.k, d.n, dy_data, d.n, false, in<BFloat16>(a.w), d.k, false,
                  out<BFloat16>(a.dx), d.k, a.accumulate_dx ? 1.0F : 0.0F),
             stream_);
  }
  if (!a.dw.empty()) {  // dw (n, k) += dy^T (n, m) x (m, k), in dw's dtype
    const auto* x_data = in<BFloat16>(a.x);
    add_to_gradient(a.dw, [&](auto* dw_data) {
      lt_->run(gemm(d.n, d.k, d.m, dy_data, d.n, true, x_data, d.k, false, dw_data, d.k, 1.0F,
                    a.dw.dtype()),
               stream_);
    });
  }
}

namespace {
// Tensor parallelism's vocabulary slices are the CPU backend's so far (the trainer refuses
// --tensor-parallel on CUDA before a model exists).
void decline_vocab_slice(const kernels::VocabSlice& slice, std::string_view op) {
  if (slice.sliced())
    throw core::internal_error(fmt::format("{}: a vocabulary slice on the CUDA backend", op));
}
}  // namespace

void CudaOps::embedding(const kernels::EmbeddingArgs& a) {
  decline_vocab_slice(a.vocab, "embedding");
  const kernels::RowDims d = kernels::embedding_dims(a);
  embedding_forward(out<BFloat16>(a.out), in<std::int32_t>(a.tokens), in<BFloat16>(a.table), d.rows,
                    d.hidden, d.vocab, stream_);
}

void CudaOps::embedding_backward(const kernels::EmbeddingBackwardArgs& a) {
  decline_vocab_slice(a.vocab, "embedding_backward");
  const kernels::RowDims d = kernels::embedding_dims(a);
  const std::size_t bytes = embedding_backward_workspace(d.rows, d.hidden);
  void* workspace = scratch_.get(bytes, stream_);
  const auto* token_data = in<std::int32_t>(a.tokens);
  const auto* dout_data = in<BFloat16>(a.dout);
  // The table's rows are the token ids (validated on the host): all of dtable may be written.
  add_to_gradient(a.dtable, [&](auto* dtable_data) {
    cuda::embedding_backward(dtable_data, token_data, dout_data, d.rows, d.hidden, workspace, bytes,
                             stream_);
  });
}

void CudaOps::rmsnorm(const kernels::RmsNormArgs& a) {
  const kernels::RowDims d = kernels::rmsnorm_dims(a);
  rmsnorm_forward(out<BFloat16>(a.out), out<float>(a.rstd), in<BFloat16>(a.x), in<BFloat16>(a.w),
                  d.rows, d.hidden, a.eps, stream_);
}

void CudaOps::rmsnorm_backward(const kernels::RmsNormBackwardArgs& a) {
  const kernels::RowDims d = kernels::rmsnorm_dims(a);
  auto* partials = static_cast<float*>(scratch_.get(
      static_cast<std::size_t>(rmsnorm_partials(d.rows, d.hidden)) * sizeof(float), stream_));
  if (a.dw.empty()) {  // a frozen norm (LoRA): dx only
    cuda::rmsnorm_backward(out<BFloat16>(a.dx), static_cast<BFloat16*>(nullptr),
                           in<BFloat16>(a.dout), in<BFloat16>(a.x), in<BFloat16>(a.w),
                           in<float>(a.rstd), d.rows, d.hidden, partials, stream_);
    return;
  }
  add_to_gradient(a.dw, [&](auto* dw_data) {
    cuda::rmsnorm_backward(out<BFloat16>(a.dx), dw_data, in<BFloat16>(a.dout), in<BFloat16>(a.x),
                           in<BFloat16>(a.w), in<float>(a.rstd), d.rows, d.hidden, partials,
                           stream_);
  });
}

void CudaOps::rope(const kernels::RopeArgs& a) {
  const kernels::RopeDims d = kernels::rope_dims(a);
  cuda::rope(out<BFloat16>(a.x), in<std::int32_t>(a.positions), in<float>(a.cos), in<float>(a.sin),
             d.tokens, d.heads, d.head_dim, 1.0F, stream_);
}

void CudaOps::rope_backward(const kernels::RopeArgs& a) {
  const kernels::RopeDims d = kernels::rope_dims(a);
  cuda::rope(out<BFloat16>(a.x), in<std::int32_t>(a.positions), in<float>(a.cos), in<float>(a.sin),
             d.tokens, d.heads, d.head_dim, -1.0F, stream_);
}

std::vector<std::int32_t> CudaOps::download_segments(const kernels::PackedSegments& segments) {
  // attention_shape checked that a host copy has as many entries as the device one.
  if (!segments.host.empty()) return {segments.host.begin(), segments.host.end()};
  const std::span<const std::int32_t> device = segments.cu_seqlens.as<std::int32_t>();
  std::vector<std::int32_t> host(device.size());
  check(cudaMemcpyAsync(host.data(), device.data(), host.size() * sizeof(std::int32_t),
                        cudaMemcpyDeviceToHost, stream_),
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
void CudaOps::attention(const kernels::AttentionArgs& args) {
  const kernels::AttentionShape shape = kernels::attention_shape(args);
  // Context parallelism's query rows are the CPU backend's so far (the trainer refuses
  // --context-parallel on CUDA before a model exists: train/trainer_parts.cpp).
  if (!args.query_rows.empty())
    throw core::internal_error("attention: query rows (context parallelism) on the CUDA backend");
  if (cudnn_) {
    if (cudnn_->forward(args, shape, stream_)) {
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
  const auto* qd = in<BFloat16>(args.q);
  const auto* kd = in<BFloat16>(args.k);
  const auto* vd = in<BFloat16>(args.v);
  auto* od = out<BFloat16>(args.out);
  auto* lsed = out<float>(args.lse);
  const std::vector<std::int32_t> cu = download_segments(args.segments);
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

void CudaOps::attention_backward(const kernels::AttentionBackwardArgs& args) {
  const kernels::AttentionShape shape = kernels::attention_shape(args);
  // Context parallelism's query rows are the CPU backend's so far (the trainer refuses
  // --context-parallel on CUDA before a model exists: train/trainer_parts.cpp).
  if (!args.query_rows.empty())
    throw core::internal_error("attention: query rows (context parallelism) on the CUDA backend");
  if (cudnn_) {
    if (cudnn_->backward(args, shape, stream_)) {
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
  const auto* qd = in<BFloat16>(args.q);
  const auto* kd = in<BFloat16>(args.k);
  const auto* vd = in<BFloat16>(args.v);
  const auto* od = in<BFloat16>(args.out);
  const auto* dod = in<BFloat16>(args.dout);
  const auto* lsed = in<float>(args.lse);
  auto* dqd = out<BFloat16>(args.dq);
  auto* dkd = out<BFloat16>(args.dk);
  auto* dvd = out<BFloat16>(args.dv);
  const std::vector<std::int32_t> cu = download_segments(args.segments);
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

namespace {

// The cache geometry of a generation op, from its checked sizes.
CacheGeometry cache_geometry(const kernels::KvCacheDims& d) {
  return {.rows = d.rows,
          .slots = d.slots,
          .capacity = d.capacity,
          .n_heads = d.n_heads,
          .n_kv_heads = d.n_kv_heads,
          .head_dim = d.head_dim};
}

}  // namespace

void CudaOps::kv_cache_write(const kernels::KvCacheWriteArgs& a) {
  const kernels::KvCacheDims d = kernels::kv_cache_write_dims(a);
  cuda::kv_cache_write(out<BFloat16>(a.k_cache), out<BFloat16>(a.v_cache), in<BFloat16>(a.k),
                       in<BFloat16>(a.v), in<std::int32_t>(a.slots), in<std::int32_t>(a.positions),
                       cache_geometry(d), stream_);
}

void CudaOps::rope_kv_cache_write(const kernels::RopeKvCacheWriteArgs& a) {
  // The checks of the three ops it fuses.
  const kernels::RopeDims dq =
      kernels::rope_dims({.x = a.q, .positions = a.positions, .cos = a.cos, .sin = a.sin});
  const kernels::RopeDims dk =
      kernels::rope_dims({.x = a.k, .positions = a.positions, .cos = a.cos, .sin = a.sin});
  const kernels::KvCacheDims d = kernels::kv_cache_write_dims({.k_cache = a.k_cache,
                                                               .v_cache = a.v_cache,
                                                               .k = a.k,
                                                               .v = a.v,
                                                               .slots = a.slots,
                                                               .positions = a.positions});
  if (dq.head_dim != dk.head_dim || dq.tokens != dk.tokens) {
    throw core::internal_error(
        fmt::format("cuda rope_kv_cache_write: q of {} rows x {} dims, k of {} rows x {} dims",
                    dq.tokens, dq.head_dim, dk.tokens, dk.head_dim));
  }
  cuda::rope_kv_cache_write(
      out<BFloat16>(a.q), out<BFloat16>(a.k), in<BFloat16>(a.v), out<BFloat16>(a.k_cache),
      out<BFloat16>(a.v_cache), in<std::int32_t>(a.slots), in<std::int32_t>(a.positions),
      in<float>(a.cos), in<float>(a.sin), dq.heads, cache_geometry(d), stream_);
}

void CudaOps::decode_attention(const kernels::DecodeAttentionArgs& a) {
  const kernels::KvCacheDims d = kernels::decode_attention_dims(a);
  if (d.rows == 0) return;
  // The positions on the host, when the caller has them, are checked here as the CPU backend
  // checks them; the kernel reads the device's either way (and skips a row outside the cache).
  for (std::size_t i = 0; i < a.host_positions.size(); ++i) {
    if (a.host_positions[i] < 0 || a.host_positions[i] >= d.capacity) {
      throw core::internal_error(fmt::format(
          "cuda decode_attention: row {} at position {} outside a cache of {} positions", i,
          a.host_positions[i], d.capacity));
    }
  }
  const CacheGeometry g = cache_geometry(d);
  const DecodePlan plan = plan_decode_attention(g, d.max_keys);
  void* workspace =
      plan.workspace_bytes > 0 ? scratch_.get(plan.workspace_bytes, stream_) : nullptr;
  cuda::decode_attention(out<BFloat16>(a.out), in<BFloat16>(a.q), in<BFloat16>(a.k_cache),
                         in<BFloat16>(a.v_cache), in<std::int32_t>(a.slots),
                         in<std::int32_t>(a.positions), g, plan, workspace, stream_);
}

void CudaOps::sample_tokens(const kernels::SampleTokensArgs& a) {
  const kernels::SampleDims d = kernels::sample_tokens_dims(a);
  if (d.rows == 0) return;
  void* workspace = scratch_.get(sample_tokens_workspace(d.rows), stream_);
  cuda::sample_tokens(out<std::int32_t>(a.tokens),
                      a.logprobs.empty() ? nullptr : out<float>(a.logprobs), in<float>(a.logits),
                      in<double>(a.uniforms), d.rows, d.vocab, d.candidates,
                      {.temperature = a.temperature,
                       .top_p = a.top_p,
                       .top_k = a.top_k,
                       .logprob_scale = a.logprob_scale},
                      workspace, stream_);
}

void CudaOps::swiglu(const kernels::SwigluArgs& a) {
  const std::int64_t n = kernels::swiglu_size(a);
  swiglu_forward(out<BFloat16>(a.out), in<BFloat16>(a.gate), in<BFloat16>(a.up), n, stream_);
}

void CudaOps::swiglu_backward(const kernels::SwigluBackwardArgs& a) {
  const std::int64_t n = kernels::swiglu_size(a);
  cuda::swiglu_backward(out<BFloat16>(a.dgate), out<BFloat16>(a.dup), in<BFloat16>(a.dout),
                        in<BFloat16>(a.gate), in<BFloat16>(a.up), n, stream_);
}

void CudaOps::dropout(const kernels::DropoutArgs& a) {
  const std::int64_t n = kernels::dropout_size(a);
  cuda::dropout(out<BFloat16>(a.out), in<BFloat16>(a.x), n, a.p, a.scale, a.seed, stream_);
}

void CudaOps::add_into(TensorView dst, ConstTensorView src) {
  const std::int64_t n = kernels::add_into_size(dst, src);
  const auto* from = in<BFloat16>(src);
  if (dst.dtype() == DType::f32) {
    cuda::add_into(out<float>(dst), from, n, stream_);
  } else {
    cuda::add_into(out<BFloat16>(dst), from, n, stream_);
  }
}

double CudaOps::sum_squares(ConstTensorView x) {
  const std::int64_t n = x.numel();
  Carver carve;
  const std::size_t partials_at = carve.reserve<double>(kSumSquaresBlocks);
  const std::size_t result_at = carve.reserve<double>(1);
  void* base = scratch_.get(carve.total(), stream_);
  if (x.dtype() == DType::f32) {
    sum_squares_f32(at<double>(base, result_at), in<float>(x), n, at<double>(base, partials_at),
                    stream_);
  } else {
    cuda::sum_squares(at<double>(base, result_at), in<BFloat16>(x), n,
                      at<double>(base, partials_at), stream_);
  }
  double result = 0.0;
  check(cudaMemcpyAsync(&result, at<double>(base, result_at), sizeof(double),
                        cudaMemcpyDeviceToHost, stream_),
        "sum_squares: download");
  synchronize();
  return result;
}

void CudaOps::sum_squares_each(std::span<const ConstTensorView> xs, std::span<double> out) {
  if (xs.empty()) return;
  Carver carve;
  const std::size_t partials_at = carve.reserve<double>(kSumSquaresBlocks);
  const std::size_t results_at = carve.reserve<double>(static_cast<std::int64_t>(xs.size()));
  void* base = scratch_.get(carve.total(), stream_);
  // The partials are reused piece after piece: the kernels run in stream order.
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const ConstTensorView x = xs[i];
    double* result = at<double>(base, results_at) + i;
    if (x.dtype() == DType::f32) {
      sum_squares_f32(result, in<float>(x), x.numel(), at<double>(base, partials_at), stream_);
    } else {
      cuda::sum_squares(result, in<BFloat16>(x), x.numel(), at<double>(base, partials_at), stream_);
    }
  }
  check(cudaMemcpyAsync(out.data(), at<double>(base, results_at), xs.size() * sizeof(double),
                        cudaMemcpyDeviceToHost, stream_),
        fmt::format("sum_squares_each: download of {} sums", xs.size()));
  synchronize();
}

void CudaOps::lm_head_cross_entropy(const kernels::LmHeadCrossEntropyArgs& a) {
  if (a.vocab != nullptr) decline_vocab_slice(a.vocab->slice, "lm_head_cross_entropy");
  const kernels::LmHeadDims d = kernels::lm_head_dims(a);
  const std::int64_t counted = d.counted;
  const std::int64_t vocab = d.vocab;
  const std::int64_t hidden = d.hidden;
  const bool backward = !a.dh.empty();
  auto* sum = a.loss_sum.empty() ? nullptr : out<double>(a.loss_sum);
  auto* row_loss = a.row_loss.empty() ? nullptr : out<float>(a.row_loss);
  auto* row_entropy = a.row_entropy.empty() ? nullptr : out<float>(a.row_entropy);
  const auto* row_scale = a.row_scale.empty() ? nullptr : in<float>(a.row_scale);
  const auto* hd = in<BFloat16>(a.h);
  const auto* wd = in<BFloat16>(a.w);
  const auto* rd = in<std::int32_t>(a.rows);
  const auto* td = in<std::int32_t>(a.targets);
  if (backward) zero(a.dh);
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
    // logits (block, V) = logit_scale * hb (block, H) w^T, in fp32
    RowMajorGemm to_logits = gemm(block, vocab, hidden, hb, hidden, false, wd, hidden, true, logits,
                                  vocab, 0.0F, DType::f32);
    to_logits.alpha = a.logit_scale;
    lt_->run(to_logits, stream_);
    softmax_cross_entropy(losses + begin, dlogits, logits, td + begin,
                          row_scale == nullptr ? nullptr : row_scale + begin, block, vocab,
                          a.grad_scale, stream_,
                          row_entropy == nullptr ? nullptr : row_entropy + begin);
    if (!backward) continue;
    // dhb (block, H) = logit_scale * dlogits (block, V) w (V, H), then into dh's counted rows
    RowMajorGemm to_dh =
        gemm(block, hidden, vocab, dlogits, vocab, false, wd, hidden, false, dhb, hidden, 0.0F);
    to_dh.alpha = a.logit_scale;
    lt_->run(to_dh, stream_);
    scatter_rows(out<BFloat16>(a.dh), dhb, rd + begin, block, hidden, stream_);
    if (a.dw.empty()) continue;  // a frozen lm_head (LoRA)
    // dw (V, H) += logit_scale * dlogits^T (V, block) hb (block, H)
    add_to_gradient(a.dw, [&](auto* dw_data) {
      RowMajorGemm to_dw = gemm(vocab, hidden, block, dlogits, vocab, true, hb, hidden, false,
                                dw_data, hidden, 1.0F, a.dw.dtype());
      to_dw.alpha = a.logit_scale;
      lt_->run(to_dw, stream_);
    });
  }
  if (row_loss != nullptr) {
    check(cudaMemcpyAsync(row_loss, losses, static_cast<std::size_t>(counted) * sizeof(float),
                          cudaMemcpyDeviceToDevice, stream_),
          "lm_head_cross_entropy: row losses");
  }
  // stays on the device: no synchronisation
  if (sum != nullptr) add_sum_f32(sum, losses, counted, stream_);
}

void CudaOps::bradley_terry(const kernels::BradleyTerryArgs& a) {
  const std::int64_t pairs = kernels::bradley_terry_pairs(a);
  cuda::bradley_terry(out<double>(a.sums), a.d_scores.empty() ? nullptr : out<float>(a.d_scores),
                      in<float>(a.scores), a.margins.empty() ? nullptr : in<float>(a.margins),
                      pairs, a.center, a.grad_scale, stream_);
}

void CudaOps::sequence_log_probs(const kernels::SequenceLogProbsArgs& a) {
  const std::int64_t sequences = kernels::sequence_count(a);
  if (sequences == 0) return;
  const auto* row_loss = a.row_loss.empty() ? nullptr : in<float>(a.row_loss);
  cuda::sequence_log_probs(out<double>(a.logps), row_loss, a.row_loss.numel(),
                           in<std::int32_t>(a.ranges), sequences, a.mean, stream_);
}

void CudaOps::dpo_loss(const kernels::DpoLossArgs& a) {
  const std::int64_t pairs = kernels::dpo_pairs(a);
  auto* d_rows = a.d_rows.empty() ? nullptr : out<float>(a.d_rows);
  if (pairs == 0 && d_rows == nullptr) return;  // nothing to add, nothing to zero
  const auto* row_loss = a.row_loss.empty() ? nullptr : in<float>(a.row_loss);
  const auto* ranges = pairs == 0 ? nullptr : in<std::int32_t>(a.ranges);
  const auto* reference = pairs == 0 ? nullptr : in<double>(a.reference);
  cuda::dpo_loss(out<double>(a.sums), d_rows, row_loss, a.row_loss.numel(), ranges, reference,
                 pairs, a.beta, a.label_smoothing, a.loss, a.grad_scale, stream_);
}

void CudaOps::policy_loss(const kernels::PolicyLossArgs& a) {
  const std::int64_t rows = kernels::policy_rows(a);
  if (rows == 0) return;  // nothing to add, nothing to write
  auto optional = [](ConstTensorView x) -> const float* {
    return x.empty() ? nullptr : in<float>(x);
  };
  cuda::policy_loss(
      out<double>(a.sums), a.sampled_logps.empty() ? nullptr : out<double>(a.largest),
      a.d_rows.empty() ? nullptr : out<float>(a.d_rows),
      {.row_loss = in<float>(a.row_loss),
       .advantages = in<float>(a.advantages),
       .weights = in<float>(a.weights),
       .old_logps = optional(a.old_logps),
       .ref_row_loss = optional(a.ref_row_loss),
       .sampled_logps = optional(a.sampled_logps),
       .row_entropy = optional(a.row_entropy),
       .completion_starts =
           a.completion_starts.empty() ? nullptr : in<std::int32_t>(a.completion_starts),
       .completions = std::max<std::int64_t>(a.completion_starts.numel() - 1, 0)},
      rows,
      {.epsilon_low = a.epsilon_low,
       .epsilon_high = a.epsilon_high,
       .beta = a.beta,
       .importance_sampling = a.importance_sampling,
       .clip_min = a.clip_min,
       .clip_max = a.clip_max,
       .grad_scale = a.grad_scale},
      stream_);
}

void CudaOps::gather_dot(const kernels::GatherDotArgs& a) {
  const kernels::GatherDims d = kernels::gather_dot_dims(a);
  cuda::gather_dot(out<float>(a.scores), in<BFloat16>(a.h), in<BFloat16>(a.w),
                   in<std::int32_t>(a.rows), d.count, d.hidden, stream_);
}

void CudaOps::gather_dot_backward(const kernels::GatherDotBackwardArgs& a) {
  const kernels::GatherDims d = kernels::gather_dot_dims(a);
  add_to_gradient(a.dw, [&](auto* dw_data) {
    cuda::gather_dot_backward(out<BFloat16>(a.dh), dw_data, in<float>(a.dscores), in<BFloat16>(a.h),
                              in<BFloat16>(a.w), in<std::int32_t>(a.rows), d.count, d.hidden,
                              stream_);
  });
}

void CudaOps::adamw(const kernels::AdamWArgs& a) {
  const std::int64_t n = kernels::adamw_size(a);
  auto* master = out<float>(a.params);
  auto* copy = a.params_copy.empty() ? nullptr : out<BFloat16>(a.params_copy);
  auto* m1 = out<float>(a.m);
  auto* m2 = out<float>(a.v);
  if (a.grads.dtype() == DType::f32) {  // ZeRO-2's accumulated shard
    cuda::adamw(master, copy, in<float>(a.grads), m1, m2, n, a.hyper, stream_);
  } else {
    cuda::adamw(master, copy, in<BFloat16>(a.grads), m1, m2, n, a.hyper, stream_);
  }
}

}  // namespace l3::cuda
