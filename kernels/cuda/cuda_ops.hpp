// The CUDA backend: bf16 activations and weights, fp32 accumulation and statistics, fp32
// master weights and AdamW state. Matmuls on cuBLASLt; attention on cuDNN's fused flash
// attention when asked for (CudaOptions::cudnn_attention) and cuDNN supports the shape, else on
// cuBLAS batched GEMMs with causal-softmax kernels (the fallback, exact and simple); everything
// else on the kernels
// of kernels/cuda/*.cu. All work is queued on one stream; calls that return a value (squared
// norms) and copies to host memory synchronise it; copies from host memory do not (pinned
// staging, PinnedUploads), and a micro-batch's inputs go on a copy stream (InputStager).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/pinned_uploads.hpp"
#include "kernels/ops.hpp"

namespace l3::cuda {

class LtMatmul;

// A grow-only device buffer for the temporaries of one op at a time.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  DeviceScratch(DeviceScratch&&) = delete;
  DeviceScratch& operator=(DeviceScratch&&) = delete;
  // At least `bytes`, 256-byte aligned; the previous contents are not kept.
  void* get(std::size_t bytes, cudaStream_t stream);
  // Changes whenever get() replaces the buffer (a graph recorded before then is stale).
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::uint64_t generation_ = 0;
};

class CudnnAttention;
class InputStager;

struct CudaOptions {
  int device = -1;               // the CUDA device to use (-1: the current one)
  bool cudnn_attention = false;  // cuDNN's fused attention where supported (else the fallback)
  bool deterministic = false;    // the same bits run after run (cuDNN's deterministic backward)
};

class CudaOps final : public kernels::Ops {
 public:
  explicit CudaOps(CudaOptions options);
  explicit CudaOps(int device = -1) : CudaOps(CudaOptions{.device = device}) {}
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;
  CudaOps(CudaOps&&) = delete;
  CudaOps& operator=(CudaOps&&) = delete;

  [[nodiscard]] std::string_view name() const noexcept override { return "cuda"; }
  [[nodiscard]] kernels::Backend backend() const noexcept override {
    return kernels::Backend::cuda;
  }
  [[nodiscard]] kernels::DType compute_dtype() const noexcept override {
    return kernels::DType::bf16;
  }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  // Attention calls cuDNN ran, and those it declined (run by the fallback) with the last reason.
  struct AttentionCounts {
    std::int64_t cudnn = 0;
    std::int64_t fallback = 0;
    std::string last_declined;
  };
  [[nodiscard]] const AttentionCounts& attention_counts() const noexcept { return attention_; }
  [[nodiscard]] std::string report() const override;
  [[nodiscard]] int device() const noexcept { return device_; }
  void bind_thread() override;
  [[nodiscard]] std::int64_t memory_capacity() const override;

  [[nodiscard]] kernels::Buffer allocate(kernels::DType dtype, std::int64_t numel) override;
  [[nodiscard]] std::int64_t allocated_bytes() const noexcept override { return allocated_.load(); }
  void zero(kernels::TensorView x) override;
  void copy(kernels::TensorView dst, kernels::ConstTensorView src) override;
  // Waits for the stream. With wait checks added, it polls instead of blocking and runs them
  // between polls; they may throw (each NCCL exchange: a collective whose peer is gone spins
  // forever, and only ncclCommGetAsyncError says so). A run may hold several exchanges (the
  // gradients', ZeRO-3's gathers', hybrid sharding's replicas'): each adds its own check and
  // removes it by the key it got.
  void synchronize() override;
  [[nodiscard]] int add_wait_check(std::function<void()> check);
  void remove_wait_check(int key) noexcept { wait_checks_.erase(key); }
  // On a copy stream of its own (InputStager), overlapping the queued compute.
  void upload_inputs(int set, std::span<const kernels::HostUpload> uploads) override;
  [[nodiscard]] double take_input_wait_ms() override;

  void matmul(const kernels::MatmulArgs& a) override;
  void matmul_backward(const kernels::MatmulBackwardArgs& a) override;
  void embedding(const kernels::EmbeddingArgs& a) override;
  void embedding_backward(const kernels::EmbeddingBackwardArgs& a) override;
  void rmsnorm(const kernels::RmsNormArgs& a) override;
  void rmsnorm_backward(const kernels::RmsNormBackwardArgs& a) override;
  void rope(const kernels::RopeArgs& a) override;
  void rope_backward(const kernels::RopeArgs& a) override;
  void attention(const kernels::AttentionArgs& a) override;
  void attention_backward(const kernels::AttentionBackwardArgs& a) override;
  void kv_cache_write(const kernels::KvCacheWriteArgs& a) override;
  void rope_kv_cache_write(const kernels::RopeKvCacheWriteArgs& a) override;
  void decode_attention(const kernels::DecodeAttentionArgs& a) override;
  void sample_tokens(const kernels::SampleTokensArgs& a) override;
  void swiglu(const kernels::SwigluArgs& a) override;
  void swiglu_backward(const kernels::SwigluBackwardArgs& a) override;
  void dropout(const kernels::DropoutArgs& a) override;
  void lm_head_cross_entropy(const kernels::LmHeadCrossEntropyArgs& a) override;
  void gather_dot(const kernels::GatherDotArgs& a) override;
  void gather_dot_backward(const kernels::GatherDotBackwardArgs& a) override;
  void bradley_terry(const kernels::BradleyTerryArgs& a) override;
  void sequence_log_probs(const kernels::SequenceLogProbsArgs& a) override;
  void dpo_loss(const kernels::DpoLossArgs& a) override;
  void policy_loss(const kernels::PolicyLossArgs& a) override;
  void adamw(const kernels::AdamWArgs& a) override;
  void add_into(kernels::TensorView dst, kernels::ConstTensorView src) override;
  [[nodiscard]] double sum_squares(kernels::ConstTensorView x) override;
  void sum_squares_each(std::span<const kernels::ConstTensorView> xs,
                        std::span<double> out) override;
  // CUDA graphs: stream capture of the backend's stream (thread-local mode), instantiated;
  // replay() launches it on the stream. A graph must not outlive this backend.
  [[nodiscard]] bool can_capture() const noexcept override { return true; }
  [[nodiscard]] std::unique_ptr<kernels::OpsGraph> capture(
      const std::function<void()>& record) override;

 private:
  // The segment table on the host: segments.host when given, else downloaded (a sync).
  std::vector<std::int32_t> download_segments(const kernels::PackedSegments& segments);

  int device_ = 0;
  std::atomic<std::int64_t> allocated_{0};  // allocated_bytes()
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<LtMatmul> lt_;
  DeviceScratch scratch_;
  PinnedUploads uploads_;                // host -> device copies, without a stream synchronisation
  std::unique_ptr<InputStager> inputs_;  // micro-batch inputs on the copy stream (first use)
  std::unique_ptr<CudnnAttention> cudnn_;  // null: the fallback attention only
  AttentionCounts attention_;
  // By key; none: synchronize() blocks in cudaStreamSynchronize.
  std::map<int, std::function<void()>> wait_checks_;
  int next_wait_check_ = 0;
};

}  // namespace l3::cuda
