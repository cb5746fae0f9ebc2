// An Ops decorator for generation: every matmul it forwards is row-invariant (MatmulArgs::
// row_invariant), so that each row's result does not depend on the other rows of the call and
// a completion is the same in whatever batch, slot or rank it ran. Everything else is the
// inner backend's.
#pragma once

#include "kernels/ops.hpp"

namespace l3::kernels {

class RowInvariantOps final : public Ops {
 public:
  explicit RowInvariantOps(Ops& inner) : inner_(inner) {}

  void matmul(const MatmulArgs& a) override {
    MatmulArgs invariant = a;
    invariant.row_invariant = true;
    inner_.matmul(invariant);
  }

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
  [[nodiscard]] double take_input_wait_ms() override { return inner_.take_input_wait_ms(); }
  [[nodiscard]] double sum_squares(ConstTensorView x) override { return inner_.sum_squares(x); }
  void sum_squares_each(std::span<const ConstTensorView> xs, std::span<double> out) override {
    inner_.sum_squares_each(xs, out);
  }
  void zero(TensorView x) override { inner_.zero(x); }
  void copy(TensorView dst, ConstTensorView src) override { inner_.copy(dst, src); }
  void upload_inputs(int set, std::span<const HostUpload> uploads) override {
    inner_.upload_inputs(set, uploads);
  }
  void matmul_backward(const MatmulBackwardArgs& a) override { inner_.matmul_backward(a); }
  void embedding(const EmbeddingArgs& a) override { inner_.embedding(a); }
  void embedding_backward(const EmbeddingBackwardArgs& a) override { inner_.embedding_backward(a); }
  void rmsnorm(const RmsNormArgs& a) override { inner_.rmsnorm(a); }
  void rmsnorm_backward(const RmsNormBackwardArgs& a) override { inner_.rmsnorm_backward(a); }
  void rope(const RopeArgs& a) override { inner_.rope(a); }
  void rope_backward(const RopeArgs& a) override { inner_.rope_backward(a); }
  void attention(const AttentionArgs& a) override { inner_.attention(a); }
  void attention_backward(const AttentionBackwardArgs& a) override { inner_.attention_backward(a); }
  void kv_cache_write(const KvCacheWriteArgs& a) override { inner_.kv_cache_write(a); }
  void rope_kv_cache_write(const RopeKvCacheWriteArgs& a) override {
    inner_.rope_kv_cache_write(a);
  }
  void decode_attention(const DecodeAttentionArgs& a) override { inner_.decode_attention(a); }
  void sample_tokens(const SampleTokensArgs& a) override { inner_.sample_tokens(a); }
  void swiglu(const SwigluArgs& a) override { inner_.swiglu(a); }
  void swiglu_backward(const SwigluBackwardArgs& a) override { inner_.swiglu_backward(a); }
  void dropout(const DropoutArgs& a) override { inner_.dropout(a); }
  void lm_head_cross_entropy(const LmHeadCrossEntropyArgs& a) override {
    inner_.lm_head_cross_entropy(a);
  }
  void gather_dot(const GatherDotArgs& a) override { inner_.gather_dot(a); }
  void gather_dot_backward(const GatherDotBackwardArgs& a) override {
    inner_.gather_dot_backward(a);
  }
  void bradley_terry(const BradleyTerryArgs& a) override { inner_.bradley_terry(a); }
  void sequence_log_probs(const SequenceLogProbsArgs& a) override { inner_.sequence_log_probs(a); }
  void dpo_loss(const DpoLossArgs& a) override { inner_.dpo_loss(a); }
  void policy_loss(const PolicyLossArgs& a) override { inner_.policy_loss(a); }
  void adamw(const AdamWArgs& a) override { inner_.adamw(a); }
  void add_into(TensorView dst, ConstTensorView src) override { inner_.add_into(dst, src); }
  [[nodiscard]] bool can_capture() const noexcept override { return inner_.can_capture(); }
  [[nodiscard]] std::unique_ptr<OpsGraph> capture(const std::function<void()>& record) override {
    return inner_.capture(record);
  }

 private:
  Ops& inner_;
};

}  // namespace l3::kernels
