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
  void upload_inputs(int set, std::span<const HostUpload> uploads) override;
  [[nodiscard]] double take_input_wait_ms() override { return 0.0; }
  void sum_squares_each(std::span<const TensorView> xs, std::span<double> out) override;

  [[nodiscard]] Buffer allocate(DType dtype, std::int64_t numel) override;
  // Bytes handed out by allocate() since construction (numel x element size, not counting
  // alignment padding or frees): what model::plan_training_memory is checked against.
  [[nodiscard]] std::int64_t allocated_bytes() const noexcept { return allocated_.load(); }
  void zero(TensorView x) override;
  void copy(TensorView dst, TensorView src) override;
  void synchronize() override {}

  void matmul(TensorView y, TensorView x, TensorView w, std::int64_t m, std::int64_t n,
              std::int64_t k, bool accumulate) override;
  void matmul_backward(TensorView dx, TensorView dw, TensorView dy, TensorView x, TensorView w,
                       std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate_dx) override;
  void embedding(TensorView out, TensorView tokens, TensorView table, std::int64_t n,
                 std::int64_t hidden) override;
  void embedding_backward(TensorView dtable, TensorView tokens, TensorView dout, std::int64_t n,
                          std::int64_t hidden) override;
  void rmsnorm(TensorView out, TensorView rstd, TensorView x, TensorView w, std::int64_t rows,
               std::int64_t hidden, float eps) override;
  void rmsnorm_backward(TensorView dx, TensorView dw, TensorView dout, TensorView x, TensorView w,
                        TensorView rstd, std::int64_t rows, std::int64_t hidden) override;
  void rope(TensorView x, TensorView positions, TensorView cos, TensorView sin, std::int64_t n,
            int heads, int head_dim) override;
  void rope_backward(TensorView dx, TensorView positions, TensorView cos, TensorView sin,
                     std::int64_t n, int heads, int head_dim) override;
  void attention(TensorView out, TensorView lse, TensorView q, TensorView k, TensorView v,
                 TensorView cu_seqlens, const AttentionShape& shape) override;
  void attention_backward(TensorView dq, TensorView dk, TensorView dv, TensorView dout,
                          TensorView out, TensorView lse, TensorView q, TensorView k, TensorView v,
                          TensorView cu_seqlens, const AttentionShape& shape) override;
  void swiglu(TensorView out, TensorView gate, TensorView up, std::int64_t n) override;
  void swiglu_backward(TensorView dgate, TensorView dup, TensorView dout, TensorView gate,
                       TensorView up, std::int64_t n) override;
  void add_into(TensorView dst, TensorView src, std::int64_t n) override;
  [[nodiscard]] double sum_squares(TensorView x, std::int64_t n) override;
  void lm_head_cross_entropy(TensorView loss_sum, TensorView dh, TensorView dw, TensorView h,
                             TensorView w, TensorView rows, TensorView targets, std::int64_t n,
                             std::int64_t counted, std::int64_t vocab, std::int64_t hidden,
                             float grad_scale) override;
  void bradley_terry(TensorView sums, TensorView d_scores, TensorView scores, TensorView margins,
                     std::int64_t pairs, double center, float grad_scale) override;
  void gather_dot(TensorView scores, TensorView h, TensorView w, TensorView rows,
                  std::int64_t count, std::int64_t hidden) override;
  void gather_dot_backward(TensorView dh, TensorView dw, TensorView dscores, TensorView h,
                           TensorView w, TensorView rows, std::int64_t count,
                           std::int64_t hidden) override;
  void adamw(TensorView params, TensorView params_copy, TensorView grads, TensorView m,
             TensorView v, std::int64_t n, const AdamWParams& hyper) override;

 private:
  std::atomic<std::int64_t> allocated_{0};
};

}  // namespace l3::kernels
