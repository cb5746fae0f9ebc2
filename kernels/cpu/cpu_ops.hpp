// The CPU reference backend: fp32 everywhere, OpenMP + OpenBLAS. It is the oracle the CUDA
// backend is tested against, so it favours exactness (deterministic reductions) over tricks.
#pragma once

#include <atomic>

#include "kernels/ops.hpp"

namespace l3::kernels {

class CpuOps final : public Ops {
 public:
  [[nodiscard]] std::string_view name() const noexcept override { return "cpu"; }
  [[nodiscard]] Backend backend() const noexcept override { return Backend::cpu; }
  [[nodiscard]] DType compute_dtype() const noexcept override { return DType::f32; }
  [[nodiscard]] std::string report() const override { return {}; }
  void bind_thread() override {}  // host memory: any thread
  [[nodiscard]] std::int64_t memory_capacity() const override { return 0; }  // the host's

  [[nodiscard]] Buffer allocate(DType dtype, std::int64_t numel) override;
  [[nodiscard]] std::int64_t allocated_bytes() const noexcept override { return allocated_.load(); }
  void zero(TensorView x) override;
  void copy(TensorView dst, ConstTensorView src) override;
  void synchronize() override {}
  void upload_inputs(int set, std::span<const HostUpload> uploads) override;
  [[nodiscard]] double take_input_wait_ms() override { return 0.0; }

  void matmul(const MatmulArgs& a) override;
  void matmul_backward(const MatmulBackwardArgs& a) override;
  void embedding(const EmbeddingArgs& a) override;
  void embedding_backward(const EmbeddingBackwardArgs& a) override;
  void rmsnorm(const RmsNormArgs& a) override;
  void rmsnorm_backward(const RmsNormBackwardArgs& a) override;
  void rope(const RopeArgs& a) override;
  void rope_backward(const RopeArgs& a) override;
  void attention(const AttentionArgs& a) override;
  void attention_backward(const AttentionBackwardArgs& a) override;
  void kv_cache_write(const KvCacheWriteArgs& a) override;
  void rope_kv_cache_write(const RopeKvCacheWriteArgs& a) override;
  void decode_attention(const DecodeAttentionArgs& a) override;
  void sample_tokens(const SampleTokensArgs& a) override;
  void swiglu(const SwigluArgs& a) override;
  void dropout(const DropoutArgs& a) override;
  void swiglu_backward(const SwigluBackwardArgs& a) override;
  void lm_head_cross_entropy(const LmHeadCrossEntropyArgs& a) override;
  void gather_dot(const GatherDotArgs& a) override;
  void gather_dot_backward(const GatherDotBackwardArgs& a) override;
  void bradley_terry(const BradleyTerryArgs& a) override;
  void sequence_log_probs(const SequenceLogProbsArgs& a) override;
  void dpo_loss(const DpoLossArgs& a) override;
  void policy_loss(const PolicyLossArgs& a) override;
  void adamw(const AdamWArgs& a) override;
  void add_into(TensorView dst, ConstTensorView src) override;
  [[nodiscard]] double sum_squares(ConstTensorView x) override;
  void sum_squares_each(std::span<const ConstTensorView> xs, std::span<double> out) override;
  // The CPU runs each op as it is called: nothing to record.
  [[nodiscard]] bool can_capture() const noexcept override { return false; }
  [[nodiscard]] std::unique_ptr<OpsGraph> capture(const std::function<void()>& record) override;

 private:
  std::atomic<std::int64_t> allocated_{0};
};

}  // namespace l3::kernels
