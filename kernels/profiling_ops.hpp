// An Ops decorator that times every call it forwards (synchronising the backend around each
// one), for benchmarks and profiling: which op the step's time goes to.
#pragma once

#include <map>
#include <string>

#include "core/timer.hpp"
#include "kernels/ops.hpp"

namespace l3::kernels {

class ProfilingOps final : public Ops {
  // Records the time from construction to destruction under an op's name, returning or not.
  class OpTimer {
   public:
    OpTimer(ProfilingOps& self, const char* op) : self_(self), op_(op) {
      self_.inner_.synchronize();
    }
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;
    OpTimer(OpTimer&&) = delete;
    OpTimer& operator=(OpTimer&&) = delete;
    ~OpTimer() {
      self_.inner_.synchronize();
      self_.times_[op_].add(watch_.seconds());
    }

   private:
    ProfilingOps& self_;
    const char* op_;
    core::Stopwatch watch_;
  };

  // Defined first: the forwarding members below deduce their return types from it.
  template <typename F>
  auto timed(const char* op, F&& f) {
    const OpTimer timer(*this, op);
    return f();
  }

 public:
  explicit ProfilingOps(Ops& inner) : inner_(inner) {}

  // Seconds and calls per op name since the last clear().
  [[nodiscard]] const std::map<std::string, core::TimeAccumulator>& times() const { return times_; }
  void clear() { times_.clear(); }

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
    return timed("allocate", [&] { return inner_.allocate(dtype, numel); });
  }
  void zero(TensorView x) override {
    timed("zero", [&] { inner_.zero(x); });
  }
  void copy(TensorView dst, ConstTensorView src) override {
    timed("copy", [&] { inner_.copy(dst, src); });
  }
  void synchronize() override { inner_.synchronize(); }
  void upload_inputs(int set, std::span<const HostUpload> uploads) override {
    timed("upload_inputs", [&] { inner_.upload_inputs(set, uploads); });
  }
  [[nodiscard]] double take_input_wait_ms() override { return inner_.take_input_wait_ms(); }
  void matmul(const MatmulArgs& a) override {
    timed("matmul", [&] { inner_.matmul(a); });
  }
  void matmul_backward(const MatmulBackwardArgs& a) override {
    timed("matmul_backward", [&] { inner_.matmul_backward(a); });
  }
  void embedding(const EmbeddingArgs& a) override {
    timed("embedding", [&] { inner_.embedding(a); });
  }
  void embedding_backward(const EmbeddingBackwardArgs& a) override {
    timed("embedding_backward", [&] { inner_.embedding_backward(a); });
  }
  void rmsnorm(const RmsNormArgs& a) override {
    timed("rmsnorm", [&] { inner_.rmsnorm(a); });
  }
  void rmsnorm_backward(const RmsNormBackwardArgs& a) override {
    timed("rmsnorm_backward", [&] { inner_.rmsnorm_backward(a); });
  }
  void rope(const RopeArgs& a) override {
    timed("rope", [&] { inner_.rope(a); });
  }
  void rope_backward(const RopeArgs& a) override {
    timed("rope_backward", [&] { inner_.rope_backward(a); });
  }
  void attention(const AttentionArgs& a) override {
    timed("attention", [&] { inner_.attention(a); });
  }
  void attention_backward(const AttentionBackwardArgs& a) override {
    timed("attention_backward", [&] { inner_.attention_backward(a); });
  }
  void kv_cache_write(const KvCacheWriteArgs& a) override {
    timed("kv_cache_write", [&] { inner_.kv_cache_write(a); });
  }
  void rope_kv_cache_write(const RopeKvCacheWriteArgs& a) override {
    timed("rope_kv_cache_write", [&] { inner_.rope_kv_cache_write(a); });
  }
  void decode_attention(const DecodeAttentionArgs& a) override {
    timed("decode_attention", [&] { inner_.decode_attention(a); });
  }
  void sample_tokens(const SampleTokensArgs& a) override {
    timed("sample_tokens", [&] { inner_.sample_tokens(a); });
  }
  void swiglu(const SwigluArgs& a) override {
    timed("swiglu", [&] { inner_.swiglu(a); });
  }
  void swiglu_backward(const SwigluBackwardArgs& a) override {
    timed("swiglu_backward", [&] { inner_.swiglu_backward(a); });
  }
  void dropout(const DropoutArgs& a) override {
    timed("dropout", [&] { inner_.dropout(a); });
  }
  void lm_head_cross_entropy(const LmHeadCrossEntropyArgs& a) override {
    timed("lm_head_cross_entropy", [&] { inner_.lm_head_cross_entropy(a); });
  }
  void gather_dot(const GatherDotArgs& a) override {
    timed("gather_dot", [&] { inner_.gather_dot(a); });
  }
  void gather_dot_backward(const GatherDotBackwardArgs& a) override {
    timed("gather_dot_backward", [&] { inner_.gather_dot_backward(a); });
  }
  void bradley_terry(const BradleyTerryArgs& a) override {
    timed("bradley_terry", [&] { inner_.bradley_terry(a); });
  }
  void sequence_log_probs(const SequenceLogProbsArgs& a) override {
    timed("sequence_log_probs", [&] { inner_.sequence_log_probs(a); });
  }
  void dpo_loss(const DpoLossArgs& a) override {
    timed("dpo_loss", [&] { inner_.dpo_loss(a); });
  }
  void policy_loss(const PolicyLossArgs& a) override {
    timed("policy_loss", [&] { inner_.policy_loss(a); });
  }
  void adamw(const AdamWArgs& a) override {
    timed("adamw", [&] { inner_.adamw(a); });
  }
  void add_into(TensorView dst, ConstTensorView src) override {
    timed("add_into", [&] { inner_.add_into(dst, src); });
  }
  [[nodiscard]] double sum_squares(ConstTensorView x) override {
    return timed("sum_squares", [&] { return inner_.sum_squares(x); });
  }
  void sum_squares_each(std::span<const ConstTensorView> xs, std::span<double> out) override {
    timed("sum_squares_each", [&] { inner_.sum_squares_each(xs, out); });
  }
  // The recording's ops are timed as they are issued (host time); replays are not.
  [[nodiscard]] bool can_capture() const noexcept override { return inner_.can_capture(); }
  [[nodiscard]] std::unique_ptr<OpsGraph> capture(const std::function<void()>& record) override {
    return inner_.capture(record);
  }

  Ops& inner_;
  std::map<std::string, core::TimeAccumulator> times_;
};

}  // namespace l3::kernels
