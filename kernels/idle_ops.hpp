// An Ops decorator whose ops compute nothing: the backend a model's pass uses on a batch of no
// rows. A rank with no data for a micro-batch that the other ranks run still walks the same
// code (so that its parameter-window and gradient-ready calls are, by construction, the ones
// the other ranks make), and every op, copy and upload on the way is a no-op instead of a
// zero-row launch. Memory, synchronisation and the backend's identity are the inner one's.
#pragma once

#include <algorithm>

#include "kernels/ops.hpp"

namespace l3::kernels {

class IdleOps final : public Ops {
 public:
  explicit IdleOps(Ops& inner) : inner_(inner) {}

  [[nodiscard]] std::string_view name() const noexcept override { return inner_.name(); }
  [[nodiscard]] Backend backend() const noexcept override { return inner_.backend(); }
  [[nodiscard]] DType compute_dtype() const noexcept override { return inner_.compute_dtype(); }
  [[nodiscard]] std::string report() const override { return inner_.report(); }
  void bind_thread() override { inner_.bind_thread(); }
  [[nodiscard]] std::int64_t memory_capacity() const override { return inner_.memory_capacity(); }
  [[nodiscard]] std::int64_t allocated_bytes() const noexcept override {
    return inner_.allocated_bytes();
  }
  [[nodiscard]] Buffer allocate(DType dtype, std::int64_t numel) override {
    return inner_.allocate(dtype, numel);
  }
  void synchronize() override { inner_.synchronize(); }
  [[nodiscard]] bool can_capture() const noexcept override { return inner_.can_capture(); }
  [[nodiscard]] std::unique_ptr<OpsGraph> capture(const std::function<void()>& record) override {
    return inner_.capture(record);
  }
  [[nodiscard]] double take_input_wait_ms() override { return inner_.take_input_wait_ms(); }

  // Nothing to compute on no rows.
  void zero(TensorView /*x*/) override {}
  void copy(TensorView /*dst*/, ConstTensorView /*src*/) override {}
  void upload_inputs(int /*set*/, std::span<const HostUpload> /*uploads*/) override {}
  void matmul(const MatmulArgs& /*a*/) override {}
  void matmul_backward(const MatmulBackwardArgs& /*a*/) override {}
  void embedding(const EmbeddingArgs& /*a*/) override {}
  void embedding_backward(const EmbeddingBackwardArgs& /*a*/) override {}
  void rmsnorm(const RmsNormArgs& /*a*/) override {}
  void rmsnorm_backward(const RmsNormBackwardArgs& /*a*/) override {}
  void rope(const RopeArgs& /*a*/) override {}
  void rope_backward(const RopeArgs& /*a*/) override {}
  void attention(const AttentionArgs& /*a*/) override {}
  void attention_backward(const AttentionBackwardArgs& /*a*/) override {}
  void kv_cache_write(const KvCacheWriteArgs& /*a*/) override {}
  void rope_kv_cache_write(const RopeKvCacheWriteArgs& /*a*/) override {}
  void decode_attention(const DecodeAttentionArgs& /*a*/) override {}
  void sample_tokens(const SampleTokensArgs& /*a*/) override {}
  void swiglu(const SwigluArgs& /*a*/) override {}
  void swiglu_backward(const SwigluBackwardArgs& /*a*/) override {}
  void dropout(const DropoutArgs& /*a*/) override {}
  void lm_head_cross_entropy(const LmHeadCrossEntropyArgs& /*a*/) override {}
  void gather_dot(const GatherDotArgs& /*a*/) override {}
  void gather_dot_backward(const GatherDotBackwardArgs& /*a*/) override {}
  void bradley_terry(const BradleyTerryArgs& /*a*/) override {}
  void sequence_log_probs(const SequenceLogProbsArgs& /*a*/) override {}
  void dpo_loss(const DpoLossArgs& /*a*/) override {}
  void policy_loss(const PolicyLossArgs& /*a*/) override {}
  void adamw(const AdamWArgs& /*a*/) override {}
  void add_into(TensorView /*dst*/, ConstTensorView /*src*/) override {}
  [[nodiscard]] double sum_squares(ConstTensorView /*x*/) override { return 0.0; }
  void sum_squares_each(std::span<const ConstTensorView> /*xs*/, std::span<double> out) override {
    std::fill(out.begin(), out.end(), 0.0);
  }

 private:
  Ops& inner_;
};

}  // namespace l3::kernels
