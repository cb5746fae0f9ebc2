#include "kernels/cpu/cpu_ops.hpp"

#include <cstdlib>
#include <cstring>

#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/bradley_terry.hpp"
#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gather_dot.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/reductions.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/swiglu.hpp"

namespace l3::kernels {

namespace {

constexpr std::size_t kAlignment = 64;  // a cache line, and an AVX-512 vector

// NOLINTNEXTLINE(cppcoreguidelines-no-malloc,cppcoreguidelines-owning-memory): aligned_alloc's pair
void free_aligned(void* p) noexcept { std::free(p); }

// Views are read as f32 unless the op says otherwise; a length prefix of `count` elements.
std::span<float> f32(TensorView x, std::int64_t count) { return x.slice(0, count).as<float>(); }
std::span<const float> cf32(TensorView x, std::int64_t count) { return f32(x, count); }
std::span<const std::int32_t> ci32(TensorView x, std::int64_t count) {
  return x.slice(0, count).as<std::int32_t>();
}
std::span<float> f32_or_empty(TensorView x, std::int64_t count) {
  return x.empty() ? std::span<float>{} : f32(x, count);
}

}  // namespace

Buffer CpuOps::allocate(DType dtype, std::int64_t numel) {
  const std::size_t bytes = static_cast<std::size_t>(numel) * dtype_size(dtype);
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* data = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);  // NOLINT
  if (data == nullptr) {
    throw core::internal_error(fmt::format("out of host memory allocating {} bytes", bytes));
  }
  std::memset(data, 0, rounded == 0 ? kAlignment : rounded);
  allocated_ += static_cast<std::int64_t>(bytes);
  return {data, dtype, numel, free_aligned};
}

void CpuOps::zero(TensorView x) {
  if (x.bytes() != 0) std::memset(x.data(), 0, x.bytes());  // an empty view may have no data
}

void CpuOps::copy(TensorView dst, TensorView src) {
  if (dst.numel() != src.numel() || dst.dtype() != src.dtype()) {
    throw core::internal_error(fmt::format("cpu copy: {} x {} into {} x {}", src.numel(),
                                           dtype_name(src.dtype()), dst.numel(),
                                           dtype_name(dst.dtype())));
  }
  if (src.bytes() != 0) std::memmove(dst.data(), src.data(), src.bytes());  // empty: maybe null
}

void CpuOps::matmul(TensorView y, TensorView x, TensorView w, std::int64_t m, std::int64_t n,
                    std::int64_t k, bool accumulate) {
  cpu::matmul(f32(y, m * n), cf32(x, m * k), cf32(w, n * k), m, n, k, accumulate);
}

void CpuOps::matmul_backward(TensorView dx, TensorView dw, TensorView dy, TensorView x,
                             TensorView w, std::int64_t m, std::int64_t n, std::int64_t k,
                             bool accumulate_dx) {
  cpu::matmul_backward(f32_or_empty(dx, m * k), f32_or_empty(dw, n * k), cf32(dy, m * n),
                       dw.empty() ? std::span<const float>{} : cf32(x, m * k),
                       dx.empty() ? std::span<const float>{} : cf32(w, n * k), m, n, k,
                       accumulate_dx);
}

void CpuOps::embedding(TensorView out, TensorView tokens, TensorView table, std::int64_t n,
                       std::int64_t hidden) {
  cpu::embedding(f32(out, n * hidden), ci32(tokens, n), table.as<const float>(), hidden);
}

void CpuOps::embedding_backward(TensorView dtable, TensorView tokens, TensorView dout,
                                std::int64_t n, std::int64_t hidden) {
  cpu::embedding_backward(dtable.as<float>(), ci32(tokens, n), cf32(dout, n * hidden), hidden);
}

void CpuOps::rmsnorm(TensorView out, TensorView rstd, TensorView x, TensorView w, std::int64_t rows,
                     std::int64_t hidden, float eps) {
  cpu::rmsnorm(f32(out, rows * hidden), f32(rstd, rows), cf32(x, rows * hidden), cf32(w, hidden),
               hidden, eps);
}

void CpuOps::rmsnorm_backward(TensorView dx, TensorView dw, TensorView dout, TensorView x,
                              TensorView w, TensorView rstd, std::int64_t rows,
                              std::int64_t hidden) {
  cpu::rmsnorm_backward(f32(dx, rows * hidden), f32(dw, hidden), cf32(dout, rows * hidden),
                        cf32(x, rows * hidden), cf32(w, hidden), cf32(rstd, rows), hidden);
}

void CpuOps::rope(TensorView x, TensorView positions, TensorView cos, TensorView sin,
                  std::int64_t n, int heads, int head_dim) {
  cpu::rope(f32(x, n * heads * head_dim), ci32(positions, n), cos.as<const float>(),
            sin.as<const float>(), heads, head_dim);
}

void CpuOps::rope_backward(TensorView dx, TensorView positions, TensorView cos, TensorView sin,
                           std::int64_t n, int heads, int head_dim) {
  cpu::rope_backward(f32(dx, n * heads * head_dim), ci32(positions, n), cos.as<const float>(),
                     sin.as<const float>(), heads, head_dim);
}

void CpuOps::attention(TensorView out, TensorView lse, TensorView q, TensorView k, TensorView v,
                       TensorView cu_seqlens, const AttentionShape& shape) {
  const std::int64_t nq = shape.tokens * shape.n_heads * shape.head_dim;
  const std::int64_t nkv = shape.tokens * shape.n_kv_heads * shape.head_dim;
  cpu::attention(f32(out, nq), f32(lse, shape.tokens * shape.n_heads), cf32(q, nq), cf32(k, nkv),
                 cf32(v, nkv), ci32(cu_seqlens, shape.n_segments + 1),
                 {shape.n_heads, shape.n_kv_heads, shape.head_dim});
}

void CpuOps::attention_backward(TensorView dq, TensorView dk, TensorView dv, TensorView dout,
                                TensorView out, TensorView lse, TensorView q, TensorView k,
                                TensorView v, TensorView cu_seqlens, const AttentionShape& shape) {
  const std::int64_t nq = shape.tokens * shape.n_heads * shape.head_dim;
  const std::int64_t nkv = shape.tokens * shape.n_kv_heads * shape.head_dim;
  cpu::attention_backward(f32(dq, nq), f32(dk, nkv), f32(dv, nkv), cf32(dout, nq), cf32(out, nq),
                          cf32(lse, shape.tokens * shape.n_heads), cf32(q, nq), cf32(k, nkv),
                          cf32(v, nkv), ci32(cu_seqlens, shape.n_segments + 1),
                          {shape.n_heads, shape.n_kv_heads, shape.head_dim});
}

void CpuOps::swiglu(TensorView out, TensorView gate, TensorView up, std::int64_t n) {
  cpu::swiglu(f32(out, n), cf32(gate, n), cf32(up, n));
}

void CpuOps::swiglu_backward(TensorView dgate, TensorView dup, TensorView dout, TensorView gate,
                             TensorView up, std::int64_t n) {
  cpu::swiglu_backward(f32(dgate, n), f32(dup, n), cf32(dout, n), cf32(gate, n), cf32(up, n));
}

void CpuOps::add_into(TensorView dst, TensorView src, std::int64_t n) {
  const std::span<float> d = f32(dst, n);
  const std::span<const float> s = cf32(src, n);
#pragma omp parallel for simd schedule(static) if (n > (std::int64_t{1} << 16))
  for (std::int64_t i = 0; i < n; ++i)
    d[static_cast<std::size_t>(i)] += s[static_cast<std::size_t>(i)];
}

double CpuOps::sum_squares(TensorView x, std::int64_t n) { return cpu::sum_squares(cf32(x, n)); }

void CpuOps::sum_squares_each(std::span<const TensorView> xs, std::span<double> out) {
  for (std::size_t i = 0; i < xs.size(); ++i) out[i] = sum_squares(xs[i], xs[i].numel());
}

void CpuOps::upload_inputs(int /*set*/, std::span<const HostUpload> uploads) {
  for (const HostUpload& u : uploads) copy(u.dst, u.src);
}

void CpuOps::lm_head_cross_entropy(TensorView loss_sum, TensorView dh, TensorView dw, TensorView h,
                                   TensorView w, TensorView rows, TensorView targets,
                                   std::int64_t n, std::int64_t counted, std::int64_t vocab,
                                   std::int64_t hidden, float grad_scale) {
  const cpu::CrossEntropySum sum = cpu::lm_head_cross_entropy(
      f32_or_empty(dh, n * hidden), dh.empty() ? std::span<float>{} : f32(dw, vocab * hidden),
      cf32(h, n * hidden), cf32(w, vocab * hidden), ci32(rows, counted), ci32(targets, counted),
      vocab, hidden, grad_scale);
  loss_sum.slice(0, 1).as<double>()[0] += sum.loss;
}

void CpuOps::bradley_terry(TensorView sums, TensorView d_scores, TensorView scores,
                           TensorView margins, std::int64_t pairs, double center,
                           float grad_scale) {
  const std::span<const float> all = cf32(scores, 2 * pairs);
  const auto p = static_cast<std::size_t>(pairs);
  const std::span<float> d_all = f32_or_empty(d_scores, 2 * pairs);
  const cpu::PreferenceStats stats = cpu::bradley_terry(
      all.first(p), all.last(p), margins.empty() ? std::span<const float>{} : cf32(margins, pairs),
      center, grad_scale, d_all.empty() ? d_all : d_all.first(p),
      d_all.empty() ? d_all : d_all.last(p));
  const std::span<double> out = sums.slice(0, 3).as<double>();
  out[0] += stats.loss;
  out[1] += static_cast<double>(stats.correct);
  out[2] += stats.margin;
}

void CpuOps::gather_dot(TensorView scores, TensorView h, TensorView w, TensorView rows,
                        std::int64_t count, std::int64_t hidden) {
  cpu::gather_dot(f32(scores, count), h.as<const float>(), cf32(w, hidden), ci32(rows, count),
                  hidden);
}

void CpuOps::gather_dot_backward(TensorView dh, TensorView dw, TensorView dscores, TensorView h,
                                 TensorView w, TensorView rows, std::int64_t count,
                                 std::int64_t hidden) {
  cpu::gather_dot_backward(dh.slice(0, h.numel()).as<float>(), f32(dw, hidden),
                           cf32(dscores, count), h.as<const float>(), cf32(w, hidden),
                           ci32(rows, count), hidden);
}

void CpuOps::adamw(TensorView params, TensorView params_copy, TensorView grads, TensorView m,
                   TensorView v, std::int64_t n, const AdamWParams& hyper) {
  cpu::adamw(f32(params, n), cf32(grads, n), f32(m, n), f32(v, n), hyper);
  // A separate f32 copy (the master weights kept in optimizer shards): exact.
  if (!params_copy.empty())
    std::memcpy(f32(params_copy, n).data(), params.data(),
                static_cast<std::size_t>(n) * sizeof(float));
}

}  // namespace l3::kernels
