#include "kernels/cpu/cpu_ops.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/bradley_terry.hpp"
#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/decode_attention.hpp"
#include "kernels/cpu/dpo_loss.hpp"
#include "kernels/cpu/dropout.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gather_dot.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/policy_loss.hpp"
#include "kernels/cpu/reductions.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/swiglu.hpp"
#include "kernels/cpu/token_sampling.hpp"
#include "kernels/op_shapes.hpp"

namespace l3::kernels {

namespace {

constexpr std::size_t kAlignment = 64;  // a cache line, and an AVX-512 vector

// NOLINTNEXTLINE(cppcoreguidelines-no-malloc,cppcoreguidelines-owning-memory): aligned_alloc's pair
void free_aligned(void* p) noexcept { std::free(p); }

// The CPU backend computes in f32; indices are i32. An empty view is an empty span (an op's
// optional output), whatever its dtype.
std::span<float> f32(TensorView x) { return x.empty() ? std::span<float>{} : x.as<float>(); }
std::span<const float> f32(ConstTensorView x) {
  return x.empty() ? std::span<const float>{} : x.as<float>();
}
std::span<const std::int32_t> i32(ConstTensorView x) {
  return x.empty() ? std::span<const std::int32_t>{} : x.as<std::int32_t>();
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

void CpuOps::copy(TensorView dst, ConstTensorView src) {
  if (dst.numel() != src.numel() || dst.dtype() != src.dtype()) {
    throw core::internal_error(fmt::format("cpu copy: {} x {} into {} x {}", src.numel(),
                                           dtype_name(src.dtype()), dst.numel(),
                                           dtype_name(dst.dtype())));
  }
  if (src.bytes() != 0) std::memmove(dst.data(), src.data(), src.bytes());  // empty: maybe null
}

void CpuOps::upload_inputs(int /*set*/, std::span<const HostUpload> uploads) {
  for (const HostUpload& u : uploads) copy(u.dst, u.src);
}

void CpuOps::matmul(const MatmulArgs& a) {
  const MatmulDims d = matmul_dims(a);
  if (a.row_invariant) {
    cpu::matmul_row_invariant(f32(a.y), f32(a.x), f32(a.w), d.m, d.n, d.k, a.accumulate);
  } else {
    cpu::matmul(f32(a.y), f32(a.x), f32(a.w), d.m, d.n, d.k, a.accumulate);
  }
}

void CpuOps::matmul_backward(const MatmulBackwardArgs& a) {
  const MatmulDims d = matmul_dims(a);
  // x is read only for dw, w only for dx.
  cpu::matmul_backward(
      f32(a.dx), f32(a.dw), f32(a.dy), a.dw.empty() ? std::span<const float>{} : f32(a.x),
      a.dx.empty() ? std::span<const float>{} : f32(a.w), d.m, d.n, d.k, a.accumulate_dx);
}

void CpuOps::embedding(const EmbeddingArgs& a) {
  const RowDims d = embedding_dims(a);
  cpu::embedding(f32(a.out), i32(a.tokens), f32(a.table), d.hidden,
                 {.begin = a.vocab.begin, .whole = a.vocab.whole});
}

void CpuOps::embedding_backward(const EmbeddingBackwardArgs& a) {
  const RowDims d = embedding_dims(a);
  cpu::embedding_backward(f32(a.dtable), i32(a.tokens), f32(a.dout), d.hidden,
                          {.begin = a.vocab.begin, .whole = a.vocab.whole});
}

void CpuOps::rmsnorm(const RmsNormArgs& a) {
  const RowDims d = rmsnorm_dims(a);
  cpu::rmsnorm(f32(a.out), f32(a.rstd), f32(a.x), f32(a.w), d.hidden, a.eps);
}

void CpuOps::rmsnorm_backward(const RmsNormBackwardArgs& a) {
  const RowDims d = rmsnorm_dims(a);
  cpu::rmsnorm_backward(f32(a.dx), f32(a.dw), f32(a.dout), f32(a.x), f32(a.w), f32(a.rstd),
                        d.hidden);
}

void CpuOps::rope(const RopeArgs& a) {
  const RopeDims d = rope_dims(a);
  cpu::rope(f32(a.x), i32(a.positions), f32(a.cos), f32(a.sin), d.heads, d.head_dim);
}

void CpuOps::rope_backward(const RopeArgs& a) {
  const RopeDims d = rope_dims(a);
  cpu::rope_backward(f32(a.x), i32(a.positions), f32(a.cos), f32(a.sin), d.heads, d.head_dim);
}

void CpuOps::attention(const AttentionArgs& a) {
  const AttentionShape s = attention_shape(a);
  cpu::attention(f32(a.out), f32(a.lse), f32(a.q), f32(a.k), f32(a.v), i32(a.segments.cu_seqlens),
                 {s.n_heads, s.n_kv_heads, s.head_dim}, i32(a.query_rows));
}

void CpuOps::kv_cache_write(const KvCacheWriteArgs& a) {
  const KvCacheDims d = kv_cache_write_dims(a);
  cpu::kv_cache_write(
      f32(a.k_cache), f32(a.v_cache), f32(a.k), f32(a.v), i32(a.slots), i32(a.positions),
      {.slots = d.slots, .capacity = d.capacity},
      {.n_heads = d.n_kv_heads, .n_kv_heads = d.n_kv_heads, .head_dim = d.head_dim});
}

// The three ops in turn: on the CPU a launch costs nothing to save.
void CpuOps::rope_kv_cache_write(const RopeKvCacheWriteArgs& a) {
  rope({.x = a.q, .positions = a.positions, .cos = a.cos, .sin = a.sin});
  rope({.x = a.k, .positions = a.positions, .cos = a.cos, .sin = a.sin});
  kv_cache_write({.k_cache = a.k_cache,
                  .v_cache = a.v_cache,
                  .k = a.k,
                  .v = a.v,
                  .slots = a.slots,
                  .positions = a.positions});
}

void CpuOps::decode_attention(const DecodeAttentionArgs& a) {
  const KvCacheDims d = decode_attention_dims(a);
  cpu::decode_attention(f32(a.out), f32(a.q), f32(a.k_cache), f32(a.v_cache), i32(a.slots),
                        i32(a.positions), {.slots = d.slots, .capacity = d.capacity},
                        {.n_heads = d.n_heads, .n_kv_heads = d.n_kv_heads, .head_dim = d.head_dim});
}

void CpuOps::sample_tokens(const SampleTokensArgs& a) {
  const SampleDims d = sample_tokens_dims(a);
  cpu::sample_tokens(a.tokens.as<std::int32_t>(), f32(a.logprobs), f32(a.logits),
                     a.uniforms.as<double>(), d.vocab, d.candidates,
                     {.temperature = a.temperature,
                      .top_p = a.top_p,
                      .top_k = a.top_k,
                      .logprob_scale = a.logprob_scale});
}

void CpuOps::attention_backward(const AttentionBackwardArgs& a) {
  const AttentionShape s = attention_shape(a);
  cpu::attention_backward(f32(a.dq), f32(a.dk), f32(a.dv), f32(a.dout), f32(a.out), f32(a.lse),
                          f32(a.q), f32(a.k), f32(a.v), i32(a.segments.cu_seqlens),
                          {s.n_heads, s.n_kv_heads, s.head_dim}, i32(a.query_rows));
}

void CpuOps::swiglu(const SwigluArgs& a) {
  (void)swiglu_size(a);
  cpu::swiglu(f32(a.out), f32(a.gate), f32(a.up));
}

void CpuOps::swiglu_backward(const SwigluBackwardArgs& a) {
  (void)swiglu_size(a);
  cpu::swiglu_backward(f32(a.dgate), f32(a.dup), f32(a.dout), f32(a.gate), f32(a.up));
}

void CpuOps::dropout(const DropoutArgs& a) {
  (void)dropout_size(a);
  cpu::dropout(f32(a.out), f32(a.x), a.p, a.scale, a.seed);
}

void CpuOps::add_into(TensorView dst, ConstTensorView src) {
  const std::int64_t n = add_into_size(dst, src);
  const std::span<float> d = f32(dst);
  const std::span<const float> s = f32(src);
#pragma omp parallel for simd schedule(static) if (n > (std::int64_t{1} << 16))
  for (std::int64_t i = 0; i < n; ++i)
    d[static_cast<std::size_t>(i)] += s[static_cast<std::size_t>(i)];
}

double CpuOps::sum_squares(ConstTensorView x) { return cpu::sum_squares(f32(x)); }

std::unique_ptr<OpsGraph> CpuOps::capture(const std::function<void()>& /*record*/) {
  throw core::internal_error("the cpu backend does not capture graphs");
}

void CpuOps::sum_squares_each(std::span<const ConstTensorView> xs, std::span<double> out) {
  for (std::size_t i = 0; i < xs.size(); ++i) out[i] = sum_squares(xs[i]);
}

void CpuOps::lm_head_cross_entropy(const LmHeadCrossEntropyArgs& a) {
  const LmHeadDims d = lm_head_dims(a);
  const cpu::CrossEntropySum sum = cpu::lm_head_cross_entropy(
      f32(a.dh), a.dh.empty() || a.dw.empty() ? std::span<float>{} : f32(a.dw), f32(a.h), f32(a.w),
      i32(a.rows), i32(a.targets), d.vocab, d.hidden, a.grad_scale,
      {.loss = f32(a.row_loss),
       .scale = f32(a.row_scale),
       .entropy = f32(a.row_entropy),
       .logit_scale = a.logit_scale},
      cpu::kLogitBlockBytes, a.vocab);
  if (!a.loss_sum.empty()) a.loss_sum.as<double>()[0] += sum.loss;
}

namespace {
std::span<const cpu::RowRange> row_ranges(ConstTensorView ranges) {
  const std::span<const std::int32_t> flat = ranges.as<std::int32_t>();
  static_assert(sizeof(cpu::RowRange) == 2 * sizeof(std::int32_t));
  // (S, 2) i32 is an array of {begin, end} pairs.
  return {reinterpret_cast<const cpu::RowRange*>(flat.data()), flat.size() / 2};
}
}  // namespace

void CpuOps::sequence_log_probs(const SequenceLogProbsArgs& a) {
  (void)sequence_count(a);
  cpu::sequence_log_probs(a.logps.as<double>(), f32(a.row_loss), row_ranges(a.ranges), a.mean);
}

void CpuOps::dpo_loss(const DpoLossArgs& a) {
  (void)dpo_pairs(a);
  const cpu::DpoStats stats = cpu::dpo_loss(
      f32(a.row_loss), row_ranges(a.ranges), a.reference.as<double>(), a.beta, a.label_smoothing,
      a.loss == PreferenceLoss::ipo ? cpu::DpoKind::ipo : cpu::DpoKind::sigmoid, a.grad_scale,
      f32(a.d_rows));
  const std::span<double> out = a.sums.as<double>();
  out[0] += stats.loss;
  out[1] += static_cast<double>(stats.correct);
  out[2] += stats.margin;
  out[3] += stats.chosen;
}

void CpuOps::policy_loss(const PolicyLossArgs& a) {
  (void)policy_rows(a);
  const cpu::PolicyStats stats = cpu::policy_loss({.row_loss = f32(a.row_loss),
                                                   .advantages = f32(a.advantages),
                                                   .weights = f32(a.weights),
                                                   .old_logps = f32(a.old_logps),
                                                   .ref_row_loss = f32(a.ref_row_loss),
                                                   .sampled_logps = f32(a.sampled_logps),
                                                   .row_entropy = f32(a.row_entropy),
                                                   .completion_starts = i32(a.completion_starts)},
                                                  {.epsilon_low = a.epsilon_low,
                                                   .epsilon_high = a.epsilon_high,
                                                   .beta = a.beta,
                                                   .importance_sampling = a.importance_sampling,
                                                   .clip_min = a.clip_min,
                                                   .clip_max = a.clip_max,
                                                   .grad_scale = a.grad_scale},
                                                  f32(a.d_rows));
  const std::span<double> out = a.sums.as<double>();
  out[0] += stats.loss;
  out[1] += stats.kl;
  out[2] += static_cast<double>(stats.low);
  out[3] += static_cast<double>(stats.high);
  out[4] += stats.entropy;
  if (a.importance_sampling != ImportanceSampling::off) {
    out[5] += stats.ratio_sum;
    out[6] += static_cast<double>(stats.ratio_units);
    out[7] += static_cast<double>(stats.rejected);
  }
  if (!a.sampled_logps.empty()) {
    const std::span<double> largest = a.largest.as<double>();
    largest[0] = std::max(largest[0], stats.largest);
    if (a.importance_sampling != ImportanceSampling::off) {
      largest[1] = std::max(largest[1], stats.ratio_max);
      // The smallest ratio as a maximum that starts at 0 (no unit: 1 / inf = 0).
      largest[2] = std::max(largest[2], 1.0 / (1.0 + stats.ratio_min));
    }
  }
}

void CpuOps::bradley_terry(const BradleyTerryArgs& a) {
  const auto p = static_cast<std::size_t>(bradley_terry_pairs(a));
  const std::span<const float> all = f32(a.scores);
  const std::span<float> d_all = f32(a.d_scores);
  const cpu::PreferenceStats stats = cpu::bradley_terry(
      all.first(p), all.last(p), f32(a.margins), a.center, a.grad_scale,
      d_all.empty() ? d_all : d_all.first(p), d_all.empty() ? d_all : d_all.last(p));
  const std::span<double> out = a.sums.as<double>();
  out[0] += stats.loss;
  out[1] += static_cast<double>(stats.correct);
  out[2] += stats.margin;
}

void CpuOps::gather_dot(const GatherDotArgs& a) {
  const GatherDims d = gather_dot_dims(a);
  cpu::gather_dot(f32(a.scores), f32(a.h), f32(a.w), i32(a.rows), d.hidden);
}

void CpuOps::gather_dot_backward(const GatherDotBackwardArgs& a) {
  const GatherDims d = gather_dot_dims(a);
  cpu::gather_dot_backward(f32(a.dh), f32(a.dw), f32(a.dscores), f32(a.h), f32(a.w), i32(a.rows),
                           d.hidden);
}

void CpuOps::adamw(const AdamWArgs& a) {
  const std::int64_t n = adamw_size(a);
  cpu::adamw(f32(a.params), f32(a.grads), f32(a.m), f32(a.v), a.hyper);
  // A separate f32 copy (the master weights kept in optimizer shards): exact.
  if (!a.params_copy.empty())
    std::memcpy(f32(a.params_copy).data(), a.params.data(),
                static_cast<std::size_t>(n) * sizeof(float));
}

}  // namespace l3::kernels
