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
  [[nodiscard]] Buffer allocate(DType dtype, std::int64_t numel) override {
    return timed("allocate", [&] { return inner_.allocate(dtype, numel); });
  }
  void zero(TensorView x) override {
    timed("zero", [&] { inner_.zero(x); });
  }
  void copy(TensorView dst, TensorView src) override {
    timed("copy", [&] { inner_.copy(dst, src); });
  }
  void synchronize() override { inner_.synchronize(); }
  void upload_inputs(int set, std::span<const HostUpload> uploads) override {
    timed("upload_inputs", [&] { inner_.upload_inputs(set, uploads); });
  }
  [[nodiscard]] double take_input_wait_ms() override { return inner_.take_input_wait_ms(); }
  void matmul(TensorView y, TensorView x, TensorView w, std::int64_t m, std::int64_t n,
              std::int64_t k, bool accumulate) override {
    timed("matmul", [&] { inner_.matmul(y, x, w, m, n, k, accumulate); });
  }

  void matmul_backward(TensorView dx, TensorView dw, TensorView dy, TensorView x, TensorView w,
                       std::int64_t m, std::int64_t n, std::int64_t k,
                       bool accumulate_dx) override {
    timed("matmul_backward",
          [&] { inner_.matmul_backward(dx, dw, dy, x, w, m, n, k, accumulate_dx); });
  }
  void embedding(TensorView out, TensorView tokens, TensorView table, std::int64_t n,
                 std::int64_t hidden) override {
    timed("embedding", [&] { inner_.embedding(out, tokens, table, n, hidden); });
  }
  void embedding_backward(TensorView dtable, TensorView tokens, TensorView dout, std::int64_t n,
                          std::int64_t hidden) override {
    timed("embedding_backward",
          [&] { inner_.embedding_backward(dtable, tokens, dout, n, hidden); });
  }
  void rmsnorm(TensorView out, TensorView rstd, TensorView x, TensorView w, std::int64_t rows,
               std::int64_t hidden, float eps) override {
    timed("rmsnorm", [&] { inner_.rmsnorm(out, rstd, x, w, rows, hidden, eps); });
  }
  void rmsnorm_backward(TensorView dx, TensorView dw, TensorView dout, TensorView x, TensorView w,
                        TensorView rstd, std::int64_t rows, std::int64_t hidden) override {
    timed("rmsnorm_backward",
          [&] { inner_.rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, hidden); });
  }
  void rope(TensorView x, TensorView positions, TensorView cos, TensorView sin, std::int64_t n,
            int heads, int head_dim) override {
    timed("rope", [&] { inner_.rope(x, positions, cos, sin, n, heads, head_dim); });
  }
  void rope_backward(TensorView dx, TensorView positions, TensorView cos, TensorView sin,
                     std::int64_t n, int heads, int head_dim) override {
    timed("rope_backward",
          [&] { inner_.rope_backward(dx, positions, cos, sin, n, heads, head_dim); });
  }
  void attention(TensorView out, TensorView lse, TensorView q, TensorView k, TensorView v,
                 TensorView cu_seqlens, const AttentionShape& shape) override {
    timed("attention", [&] { inner_.attention(out, lse, q, k, v, cu_seqlens, shape); });
  }
  void attention_backward(TensorView dq, TensorView dk, TensorView dv, TensorView dout,
                          TensorView out, TensorView lse, TensorView q, TensorView k, TensorView v,
                          TensorView cu_seqlens, const AttentionShape& shape) override {
    timed("attention_backward", [&] {
      inner_.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, cu_seqlens, shape);
    });
  }
  void swiglu(TensorView out, TensorView gate, TensorView up, std::int64_t n) override {
    timed("swiglu", [&] { inner_.swiglu(out, gate, up, n); });
  }
  void swiglu_backward(TensorView dgate, TensorView dup, TensorView dout, TensorView gate,
                       TensorView up, std::int64_t n) override {
    timed("swiglu_backward", [&] { inner_.swiglu_backward(dgate, dup, dout, gate, up, n); });
  }
  void add_into(TensorView dst, TensorView src, std::int64_t n) override {
    timed("add_into", [&] { inner_.add_into(dst, src, n); });
  }
  [[nodiscard]] double sum_squares(TensorView x, std::int64_t n) override {
    return timed("sum_squares", [&] { return inner_.sum_squares(x, n); });
  }
  void sum_squares_each(std::span<const TensorView> xs, std::span<double> out) override {
    timed("sum_squares_each", [&] { inner_.sum_squares_each(xs, out); });
  }
  void lm_head_cross_entropy(TensorView loss_sum, TensorView dh, TensorView dw, TensorView h,
                             TensorView w, TensorView rows, TensorView targets, std::int64_t n,
                             std::int64_t counted, std::int64_t vocab, std::int64_t hidden,
                             float grad_scale) override {
    timed("lm_head_cross_entropy", [&] {
      inner_.lm_head_cross_entropy(loss_sum, dh, dw, h, w, rows, targets, n, counted, vocab, hidden,
                                   grad_scale);
    });
  }
  void bradley_terry(TensorView sums, TensorView d_scores, TensorView scores, TensorView margins,
                     std::int64_t pairs, double center, float grad_scale) override {
    timed("bradley_terry", [&] {
      inner_.bradley_terry(sums, d_scores, scores, margins, pairs, center, grad_scale);
    });
  }
  void gather_dot(TensorView scores, TensorView h, TensorView w, TensorView rows,
                  std::int64_t count, std::int64_t hidden) override {
    timed("gather_dot", [&] { inner_.gather_dot(scores, h, w, rows, count, hidden); });
  }
  void gather_dot_backward(TensorView dh, TensorView dw, TensorView dscores, TensorView h,
                           TensorView w, TensorView rows, std::int64_t count,
                           std::int64_t hidden) override {
    timed("gather_dot_backward",
          [&] { inner_.gather_dot_backward(dh, dw, dscores, h, w, rows, count, hidden); });
  }
  void adamw(TensorView params, TensorView params_copy, TensorView grads, TensorView m,
             TensorView v, std::int64_t n, const AdamWParams& hyper) override {
    timed("adamw", [&] { inner_.adamw(params, params_copy, grads, m, v, n, hyper); });
  }

  Ops& inner_;
  std::map<std::string, core::TimeAccumulator> times_;
};

}  // namespace l3::kernels
