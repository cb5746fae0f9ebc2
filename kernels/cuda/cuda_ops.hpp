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

#include <functional>
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

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
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
  void zero(kernels::TensorView x) override;
  void copy(kernels::TensorView dst, kernels::TensorView src) override;
  // Waits for the stream. With a wait check set, it polls instead of blocking and runs the check
  // between polls, which may throw (the NCCL exchange: a collective whose peer is gone spins
  // forever, and only ncclCommGetAsyncError says so).
  void synchronize() override;
  void set_wait_check(std::function<void()> check) { wait_check_ = std::move(check); }
  // On a copy stream of its own (InputStager), overlapping the queued compute.
  void upload_inputs(int set, std::span<const kernels::HostUpload> uploads) override;
  [[nodiscard]] double take_input_wait_ms() override;

  void matmul(kernels::TensorView y, kernels::TensorView x, kernels::TensorView w, std::int64_t m,
              std::int64_t n, std::int64_t k, bool accumulate) override;
  void matmul_backward(kernels::TensorView dx, kernels::TensorView dw, kernels::TensorView dy,
                       kernels::TensorView x, kernels::TensorView w, std::int64_t m, std::int64_t n,
                       std::int64_t k, bool accumulate_dx) override;
  void embedding(kernels::TensorView out, kernels::TensorView tokens, kernels::TensorView table,
                 std::int64_t n, std::int64_t hidden) override;
  void embedding_backward(kernels::TensorView dtable, kernels::TensorView tokens,
                          kernels::TensorView dout, std::int64_t n, std::int64_t hidden) override;
  void rmsnorm(kernels::TensorView out, kernels::TensorView rstd, kernels::TensorView x,
               kernels::TensorView w, std::int64_t rows, std::int64_t hidden, float eps) override;
  void rmsnorm_backward(kernels::TensorView dx, kernels::TensorView dw, kernels::TensorView dout,
                        kernels::TensorView x, kernels::TensorView w, kernels::TensorView rstd,
                        std::int64_t rows, std::int64_t hidden) override;
  void rope(kernels::TensorView x, kernels::TensorView positions, kernels::TensorView cos,
            kernels::TensorView sin, std::int64_t n, int heads, int head_dim) override;
  void rope_backward(kernels::TensorView dx, kernels::TensorView positions, kernels::TensorView cos,
                     kernels::TensorView sin, std::int64_t n, int heads, int head_dim) override;
  void attention(kernels::TensorView out, kernels::TensorView lse, kernels::TensorView q,
                 kernels::TensorView k, kernels::TensorView v, kernels::TensorView cu_seqlens,
                 const kernels::AttentionShape& shape) override;
  void attention_backward(kernels::TensorView dq, kernels::TensorView dk, kernels::TensorView dv,
                          kernels::TensorView dout, kernels::TensorView out,
                          kernels::TensorView lse, kernels::TensorView q, kernels::TensorView k,
                          kernels::TensorView v, kernels::TensorView cu_seqlens,
                          const kernels::AttentionShape& shape) override;
  void swiglu(kernels::TensorView out, kernels::TensorView gate, kernels::TensorView up,
              std::int64_t n) override;
  void swiglu_backward(kernels::TensorView dgate, kernels::TensorView dup, kernels::TensorView dout,
                       kernels::TensorView gate, kernels::TensorView up, std::int64_t n) override;
  void add_into(kernels::TensorView dst, kernels::TensorView src, std::int64_t n) override;
  [[nodiscard]] double sum_squares(kernels::TensorView x, std::int64_t n) override;
  void sum_squares_each(std::span<const kernels::TensorView> xs, std::span<double> out) override;
  void lm_head_cross_entropy(kernels::TensorView loss_sum, kernels::TensorView dh,
                             kernels::TensorView dw, kernels::TensorView h, kernels::TensorView w,
                             kernels::TensorView rows, kernels::TensorView targets, std::int64_t n,
                             std::int64_t counted, std::int64_t vocab, std::int64_t hidden,
                             float grad_scale) override;
  void bradley_terry(kernels::TensorView sums, kernels::TensorView d_scores,
                     kernels::TensorView scores, kernels::TensorView margins, std::int64_t pairs,
                     double center, float grad_scale) override;
  void gather_dot(kernels::TensorView scores, kernels::TensorView h, kernels::TensorView w,
                  kernels::TensorView rows, std::int64_t count, std::int64_t hidden) override;
  void gather_dot_backward(kernels::TensorView dh, kernels::TensorView dw,
                           kernels::TensorView dscores, kernels::TensorView h,
                           kernels::TensorView w, kernels::TensorView rows, std::int64_t count,
                           std::int64_t hidden) override;
  void adamw(kernels::TensorView params, kernels::TensorView params_copy, kernels::TensorView grads,
             kernels::TensorView m, kernels::TensorView v, std::int64_t n,
             const kernels::AdamWParams& hyper) override;

 private:
  // The segment table on the host: shape.host_cu_seqlens when given, else downloaded (a sync).
  std::vector<std::int32_t> download_segments(kernels::TensorView cu_seqlens,
                                              const kernels::AttentionShape& shape);

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<LtMatmul> lt_;
  DeviceScratch scratch_;
  PinnedUploads uploads_;                // host -> device copies, without a stream synchronisation
  std::unique_ptr<InputStager> inputs_;  // micro-batch inputs on the copy stream (first use)
  std::unique_ptr<CudnnAttention> cudnn_;  // null: the fallback attention only
  AttentionCounts attention_;
  std::function<void()> wait_check_;  // empty: synchronize() blocks in cudaStreamSynchronize
};

}  // namespace l3::cuda
