#include "kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <span>

#include "catch.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/decode_attention.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/token_sampling.hpp"
#include "kernels/ops.hpp"
#include "numeric_support.hpp"
#include "reference_ops.hpp"

namespace ref = l3::test::reference;
using l3::kernels::cpu::AttentionHeads;
using l3::test::rel_error;

namespace {
struct Case {
  std::vector<std::int32_t> cu_seqlens;
  AttentionHeads heads;
};
}  // namespace

TEST_CASE("attention forward matches fp64 (causal, GQA, packed segments)", "[kernels][attention]") {
  INFO("seed " << l3::test::test_seed());
  // Segments longer than one query tile (128) and several per batch, MHA and GQA.
  for (const Case& c : {Case{{0, 300}, {4, 4, 8}}, Case{{0, 5, 137, 140, 400}, {6, 2, 16}},
                        Case{{0, 1, 2, 3}, {2, 1, 4}}}) {
    const std::int64_t n = c.cu_seqlens.back();
    const AttentionHeads h = c.heads;
    l3::test::Random rnd(8);
    const auto q = rnd.normal(n * h.n_heads * h.head_dim);
    const auto k = rnd.normal(n * h.n_kv_heads * h.head_dim);
    const auto v = rnd.normal(n * h.n_kv_heads * h.head_dim);
    std::vector<float> out(q.size(), NAN);  // poisoned: an unwritten element fails
    std::vector<float> lse(n * h.n_heads, NAN);
    l3::kernels::cpu::attention(out, lse, q, k, v, c.cu_seqlens, h);
    const auto expected =
        ref::attention(l3::test::to_double(q), l3::test::to_double(k), l3::test::to_double(v),
                       c.cu_seqlens, h.n_heads, h.n_kv_heads, h.head_dim);
    CHECK(rel_error(out, expected) < 1e-5);
    for (const float l : lse) CHECK(std::isfinite(l));
  }
}

TEST_CASE("GQA equals multi-head attention on replicated K/V", "[kernels][attention]") {
  INFO("seed " << l3::test::test_seed());
  const std::vector<std::int32_t> cu = {0, 70, 90};
  const std::int64_t n = 90;
  const int heads = 4;
  const int kv_heads = 2;
  const int hd = 8;
  l3::test::Random rnd(9);
  const auto q = rnd.normal(n * heads * hd);
  const auto k = rnd.normal(n * kv_heads * hd);
  const auto v = rnd.normal(n * kv_heads * hd);
  std::vector<float> k_full(n * heads * hd);
  std::vector<float> v_full(n * heads * hd);
  for (std::int64_t t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int d = 0; d < hd; ++d) {
        k_full[(t * heads + h) * hd + d] = k[(t * kv_heads + h / 2) * hd + d];
        v_full[(t * heads + h) * hd + d] = v[(t * kv_heads + h / 2) * hd + d];
      }
  std::vector<float> gqa(q.size());
  std::vector<float> mha(q.size());
  std::vector<float> lse(n * heads);
  l3::kernels::cpu::attention(gqa, lse, q, k, v, cu, {heads, kv_heads, hd});
  l3::kernels::cpu::attention(mha, lse, q, k_full, v_full, cu, {heads, heads, hd});
  CHECK(gqa == mha);
}

TEST_CASE("attention backward matches finite differences", "[kernels][attention]") {
  INFO("seed " << l3::test::test_seed());
  const std::vector<std::int32_t> cu = {0, 3, 9, 10};
  const std::int64_t n = 10;
  const AttentionHeads h{4, 2, 4};
  l3::test::Random rnd(10);
  const auto q = rnd.normal(n * h.n_heads * h.head_dim);
  const auto k = rnd.normal(n * h.n_kv_heads * h.head_dim);
  const auto v = rnd.normal(n * h.n_kv_heads * h.head_dim);
  const auto dout = rnd.uniform(q.size());
  std::vector<float> out(q.size());
  std::vector<float> lse(n * h.n_heads);
  l3::kernels::cpu::attention(out, lse, q, k, v, cu, h);
  std::vector<float> dq(q.size(), NAN);
  std::vector<float> dk(k.size(), NAN);
  std::vector<float> dv(v.size(), NAN);
  l3::kernels::cpu::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, cu, h);

  const auto qd = l3::test::to_double(q);
  const auto kd = l3::test::to_double(k);
  const auto vd = l3::test::to_double(v);
  auto loss = [&](const std::vector<double>& qv, const std::vector<double>& kv,
                  const std::vector<double>& vv) {
    return l3::test::weighted_sum(
        ref::attention(qv, kv, vv, cu, h.n_heads, h.n_kv_heads, h.head_dim), dout);
  };
  CHECK(rel_error(dq, l3::test::finite_differences([&](const auto& x) { return loss(x, kd, vd); },
                                                   qd)) < 1e-3);
  CHECK(rel_error(dk, l3::test::finite_differences([&](const auto& x) { return loss(qd, x, vd); },
                                                   kd)) < 1e-3);
  CHECK(rel_error(dv, l3::test::finite_differences([&](const auto& x) { return loss(qd, kd, x); },
                                                   vd)) < 1e-3);
}

TEST_CASE("attention backward on segments longer than a tile", "[kernels][attention]") {
  INFO("seed " << l3::test::test_seed());
  const std::vector<std::int32_t> cu = {0, 150, 160};
  const std::int64_t n = 160;
  const AttentionHeads h{2, 1, 4};
  l3::test::Random rnd(11);
  const auto q = rnd.normal(n * h.n_heads * h.head_dim);
  const auto k = rnd.normal(n * h.n_kv_heads * h.head_dim);
  const auto v = rnd.normal(n * h.n_kv_heads * h.head_dim);
  const auto dout = rnd.uniform(q.size());
  std::vector<float> out(q.size());
  std::vector<float> lse(n * h.n_heads);
  l3::kernels::cpu::attention(out, lse, q, k, v, cu, h);
  std::vector<float> dq(q.size());
  std::vector<float> dk(k.size());
  std::vector<float> dv(v.size());
  l3::kernels::cpu::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, cu, h);
  const auto qd = l3::test::to_double(q);
  const auto kd = l3::test::to_double(k);
  const auto vd = l3::test::to_double(v);
  // A sample of coordinates (the full check is quadratic in n per coordinate).
  std::vector<std::size_t> sample;
  sample.reserve(k.size() / 37 + 1);
  for (std::size_t i = 0; i < k.size(); i += 37) sample.push_back(i);
  auto pick = [&](const std::vector<float>& g) {
    std::vector<float> out_g;
    out_g.reserve(sample.size());
    for (const std::size_t i : sample) out_g.push_back(g[i]);
    return out_g;
  };
  auto loss = [&](const std::vector<double>& qv, const std::vector<double>& kv,
                  const std::vector<double>& vv) {
    return l3::test::weighted_sum(
        ref::attention(qv, kv, vv, cu, h.n_heads, h.n_kv_heads, h.head_dim), dout);
  };
  CHECK(rel_error(pick(dk), l3::test::finite_differences(
                                [&](const auto& x) { return loss(qd, x, vd); }, kd, sample)) <
        1e-3);
  CHECK(rel_error(pick(dv), l3::test::finite_differences(
                                [&](const auto& x) { return loss(qd, kd, x); }, vd, sample)) <
        1e-3);
  CHECK(rel_error(pick(dq), l3::test::finite_differences(
                                [&](const auto& x) { return loss(x, kd, vd); }, qd, sample)) <
        1e-3);
}

namespace {
// Context parallelism's load-balanced layout: N tokens in 2C chunks, rank r holding chunks r
// and 2C - 1 - r (ascending tokens).
std::vector<std::int32_t> context_rows(std::int64_t n, int ranks, int rank) {
  const std::int64_t chunk = n / (2 * ranks);
  std::vector<std::int32_t> rows;
  for (const std::int64_t c : {std::int64_t{rank}, std::int64_t{2 * ranks - 1 - rank}}) {
    for (std::int64_t t = 0; t < chunk; ++t)
      rows.push_back(static_cast<std::int32_t>(c * chunk + t));
  }
  return rows;
}

// The rows of a (N, width) matrix that `rows` lists.
template <typename T>
std::vector<T> take_rows(const std::vector<T>& x, std::span<const std::int32_t> rows,
                         std::int64_t width) {
  std::vector<T> out;
  out.reserve(rows.size() * static_cast<std::size_t>(width));
  for (const std::int32_t r : rows) {
    out.insert(out.end(), x.begin() + r * width, x.begin() + (r + 1) * width);
  }
  return out;
}
}  // namespace

TEST_CASE("attention of some query rows: each context-parallel rank's share of the whole",
          "[kernels][attention][context]") {
  INFO("seed " << l3::test::test_seed());
  // A segment longer than a query tile and boundaries inside chunks; 2 and 4 ranks.
  const std::vector<std::int32_t> cu = {0, 20, 155, 160};
  const std::int64_t n = 160;
  const AttentionHeads h{4, 2, 8};
  const std::int64_t qw = h.n_heads * h.head_dim;
  const std::int64_t kw = h.n_kv_heads * h.head_dim;
  l3::test::Random rnd(12);
  const auto q = rnd.normal(n * qw);
  const auto k = rnd.normal(n * kw);
  const auto v = rnd.normal(n * kw);
  const auto dout = rnd.uniform(q.size());
  const auto expected =
      ref::attention(l3::test::to_double(q), l3::test::to_double(k), l3::test::to_double(v), cu,
                     h.n_heads, h.n_kv_heads, h.head_dim);
  std::vector<float> out(q.size());
  std::vector<float> lse(n * h.n_heads);
  l3::kernels::cpu::attention(out, lse, q, k, v, cu, h);
  std::vector<float> dq(q.size());
  std::vector<float> dk(k.size());
  std::vector<float> dv(v.size());
  l3::kernels::cpu::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, cu, h);

  for (const int ranks : {2, 4}) {
    INFO(ranks << " ranks");
    std::vector<float> dk_sum(k.size(), 0.0F);
    std::vector<float> dv_sum(v.size(), 0.0F);
    for (int rank = 0; rank < ranks; ++rank) {
      const std::vector<std::int32_t> rows = context_rows(n, ranks, rank);
      const auto nq = static_cast<std::int64_t>(rows.size());
      const auto q_r = take_rows(q, rows, qw);
      std::vector<float> out_r(q_r.size(), NAN);
      std::vector<float> lse_r(nq * h.n_heads, NAN);
      l3::kernels::cpu::attention(out_r, lse_r, q_r, k, v, cu, h, rows);
      CHECK(rel_error(out_r, take_rows(expected, rows, qw)) < 1e-5);
      for (int head = 0; head < h.n_heads; ++head) {
        for (std::int64_t i = 0; i < nq; ++i) {
          CHECK(std::abs(lse_r[head * nq + i] - lse[head * n + rows[i]]) < 1e-5);
        }
      }
      const auto dout_r = take_rows(dout, rows, qw);
      std::vector<float> dq_r(q_r.size(), NAN);
      std::vector<float> dk_r(k.size(), NAN);
      std::vector<float> dv_r(v.size(), NAN);
      l3::kernels::cpu::attention_backward(dq_r, dk_r, dv_r, dout_r, out_r, lse_r, q_r, k, v, cu, h,
                                           rows);
      CHECK(rel_error(dq_r, take_rows(dq, rows, qw)) < 1e-5);
      for (std::size_t i = 0; i < k.size(); ++i) {
        dk_sum[i] += dk_r[i];
        dv_sum[i] += dv_r[i];
      }
    }
    // The ranks' shares of dk and dv add up to the whole attention's (a reduce-scatter's sum).
    CHECK(rel_error(dk_sum, dk) < 1e-5);
    CHECK(rel_error(dv_sum, dv) < 1e-5);
  }

  // Unordered or out-of-range rows are refused.
  const std::vector<std::int32_t> unordered = {3, 2};
  std::vector<float> two(2 * qw);
  std::vector<float> two_lse(2 * h.n_heads);
  CHECK_THROWS(l3::kernels::cpu::attention(two, two_lse, two, k, v, cu, h, unordered));
  const std::vector<std::int32_t> beyond = {5, 160};
  CHECK_THROWS(l3::kernels::cpu::attention(two, two_lse, two, k, v, cu, h, beyond));
}

TEST_CASE("attention backward of some query rows matches finite differences",
          "[kernels][attention][context]") {
  INFO("seed " << l3::test::test_seed());
  const std::vector<std::int32_t> cu = {0, 3, 9, 12};
  const std::int64_t n = 12;
  const AttentionHeads h{4, 2, 4};
  const std::int64_t qw = h.n_heads * h.head_dim;
  l3::test::Random rnd(13);
  const auto k = rnd.normal(n * h.n_kv_heads * h.head_dim);
  const auto v = rnd.normal(n * h.n_kv_heads * h.head_dim);
  const std::vector<std::int32_t> rows = context_rows(n, 2, 0);  // tokens 0-2 and 9-11
  const auto nq = static_cast<std::int64_t>(rows.size());
  const auto q = rnd.normal(nq * qw);
  const auto dout = rnd.uniform(q.size());
  std::vector<float> out(q.size());
  std::vector<float> lse(nq * h.n_heads);
  l3::kernels::cpu::attention(out, lse, q, k, v, cu, h, rows);
  std::vector<float> dq(q.size(), NAN);
  std::vector<float> dk(k.size(), NAN);
  std::vector<float> dv(v.size(), NAN);
  l3::kernels::cpu::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, cu, h, rows);

  // The fp64 reference of the listed rows: whole-sequence attention with these queries placed
  // at their tokens (the other tokens' queries are zeros and not read).
  const auto kd = l3::test::to_double(k);
  const auto vd = l3::test::to_double(v);
  const auto qd = l3::test::to_double(q);
  auto loss = [&](const std::vector<double>& qv, const std::vector<double>& kv,
                  const std::vector<double>& vv) {
    std::vector<double> q_all(static_cast<std::size_t>(n * qw), 0.0);
    for (std::int64_t i = 0; i < nq; ++i) {
      std::copy_n(qv.begin() + i * qw, qw, q_all.begin() + rows[static_cast<std::size_t>(i)] * qw);
    }
    const auto all = ref::attention(q_all, kv, vv, cu, h.n_heads, h.n_kv_heads, h.head_dim);
    return l3::test::weighted_sum(take_rows(all, rows, qw), dout);
  };
  CHECK(rel_error(dq, l3::test::finite_differences([&](const auto& x) { return loss(x, kd, vd); },
                                                   qd)) < 1e-3);
  CHECK(rel_error(dk, l3::test::finite_differences([&](const auto& x) { return loss(qd, x, vd); },
                                                   kd)) < 1e-3);
  CHECK(rel_error(dv, l3::test::finite_differences([&](const auto& x) { return loss(qd, kd, x); },
                                                   vd)) < 1e-3);
}

TEST_CASE("decode attention against the KV cache matches fp64", "[kernels][attention][generate]") {
  INFO("seed " << l3::test::test_seed());
  namespace cpu = l3::kernels::cpu;
  for (const auto& [heads, kv_heads] : {std::pair{4, 4}, {4, 2}, {8, 2}}) {
    INFO("heads " << heads << ", kv heads " << kv_heads);
    const int hd = 8;
    const cpu::CacheShape cache{.slots = 3, .capacity = 20};
    const cpu::AttentionHeads h{.n_heads = heads, .n_kv_heads = kv_heads, .head_dim = hd};
    const std::int64_t kv_row = std::int64_t{kv_heads} * hd;
    const std::vector<std::int64_t> lengths = {20, 7, 1};  // cached positions per slot
    l3::test::Random rnd(static_cast<std::uint32_t>(30 + heads + kv_heads));
    // Every slot's rows written in one call, slots interleaved.
    std::vector<std::int32_t> slots;
    std::vector<std::int32_t> positions;
    for (std::int64_t p = 0; p < 20; ++p) {
      for (std::int32_t s = 0; s < 3; ++s) {
        if (p < lengths[static_cast<std::size_t>(s)]) {
          slots.push_back(s);
          positions.push_back(static_cast<std::int32_t>(p));
        }
      }
    }
    const auto rows = static_cast<std::int64_t>(slots.size());
    const auto k = rnd.uniform(rows * kv_row);
    const auto v = rnd.uniform(rows * kv_row);
    std::vector<float> k_cache(static_cast<std::size_t>(cache.slots * cache.capacity * kv_row), 7);
    std::vector<float> v_cache(k_cache.size(), 7);
    cpu::kv_cache_write(k_cache, v_cache, k, v, slots, positions, cache, h);
    for (std::int64_t r = 0; r < rows; ++r) {  // each row at its place
      const std::int64_t at = (slots[r] * cache.capacity + positions[r]) * kv_row;
      for (std::int64_t e = 0; e < kv_row; ++e) {
        REQUIRE(k_cache[static_cast<std::size_t>(at + e)] ==
                k[static_cast<std::size_t>(r * kv_row + e)]);
        REQUIRE(v_cache[static_cast<std::size_t>(at + e)] ==
                v[static_cast<std::size_t>(r * kv_row + e)]);
      }
    }
    // Queries: the last position of each slot, and earlier ones of slot 0 (a chunk's rows).
    const std::vector<std::int32_t> q_slots = {1, 0, 2, 0, 0};
    const std::vector<std::int32_t> q_positions = {6, 19, 0, 3, 11};
    const auto n = static_cast<std::int64_t>(q_slots.size());
    const auto q = rnd.uniform(n * heads * hd);
    std::vector<float> out(q.size());
    cpu::decode_attention(out, q, k_cache, v_cache, q_slots, q_positions, cache, h);
    std::vector<double> expected(q.size());
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (std::int64_t i = 0; i < n; ++i) {
      for (int head = 0; head < heads; ++head) {
        const int g = head / (heads / kv_heads);
        const auto key = [&](const std::vector<float>& c, std::int64_t j, int d) {
          return static_cast<double>(
              c[static_cast<std::size_t>((q_slots[i] * cache.capacity + j) * kv_row + g * hd + d)]);
        };
        std::vector<double> w;
        double max = -1e300;
        for (std::int64_t j = 0; j <= q_positions[i]; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d)
            dot += q[static_cast<std::size_t>((i * heads + head) * hd + d)] * key(k_cache, j, d);
          w.push_back(dot * scale);
          max = std::max(max, dot * scale);
        }
        double sum = 0;
        for (double& x : w) sum += (x = std::exp(x - max));
        for (int d = 0; d < hd; ++d) {
          double o = 0;
          for (std::size_t j = 0; j < w.size(); ++j)
            o += w[j] / sum * key(v_cache, static_cast<std::int64_t>(j), d);
          expected[static_cast<std::size_t>((i * heads + head) * hd + d)] = o;
        }
      }
    }
    CHECK(l3::test::rel_error(out, expected) < 1e-5);
    // A position beyond the cache is an internal error, not a read of another slot.
    std::vector<std::int32_t> bad = q_positions;
    bad[0] = 20;
    CHECK_THROWS(cpu::decode_attention(out, q, k_cache, v_cache, q_slots, bad, cache, h));
  }
}

TEST_CASE("a sampled token's log-probability is the cross-entropy kernel's row loss",
          "[kernels][generate]") {
  INFO("seed " << l3::test::test_seed());
  namespace cpu = l3::kernels::cpu;
  const std::int64_t rows = 5;
  const std::int64_t hidden = 16;
  const std::int64_t vocab = 300;
  l3::test::Random rnd(40);
  const auto h = rnd.uniform(rows * hidden);
  const auto w = rnd.normal(static_cast<std::size_t>(vocab * hidden), 2.0F);
  std::vector<float> logits(static_cast<std::size_t>(rows * vocab));
  cpu::matmul(logits, h, w, rows, vocab, hidden, false);
  std::vector<double> uniforms = {0.1, 0.9, 0.5, 0.0, 0.999};
  std::vector<std::int32_t> tokens(rows);
  std::vector<float> logprobs(rows);
  cpu::sample_tokens(tokens, logprobs, logits, uniforms, vocab, vocab,
                     {.temperature = 0.7, .top_p = 0.9, .top_k = 50});
  // The same rows through lm_head_cross_entropy with the drawn tokens as targets.
  std::vector<std::int32_t> all_rows = {0, 1, 2, 3, 4};
  std::vector<float> row_loss(rows);
  (void)cpu::lm_head_cross_entropy({}, {}, h, w, all_rows, tokens, vocab, hidden, 1.0F,
                                   {.loss = row_loss}, 1 << 20);
  for (std::int64_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    CHECK(logprobs[static_cast<std::size_t>(r)] == -row_loss[static_cast<std::size_t>(r)]);
  }

  // Tempered (GRPO's, TRL's): the log-probabilities of softmax(logits / 0.7), the same draws,
  // and the cross-entropy kernel with that logit_scale gives them as its row losses.
  const float scale = l3::kernels::logit_scale(0.7);
  std::vector<std::int32_t> tempered_tokens(rows);
  std::vector<float> tempered(rows);
  cpu::sample_tokens(tempered_tokens, tempered, logits, uniforms, vocab, vocab,
                     {.temperature = 0.7, .top_p = 0.9, .top_k = 50, .logprob_scale = scale});
  CHECK((tempered_tokens == tokens));
  (void)cpu::lm_head_cross_entropy({}, {}, h, w, all_rows, tokens, vocab, hidden, 1.0F,
                                   {.loss = row_loss, .logit_scale = scale}, 1 << 20);
  for (std::int64_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    const auto i = static_cast<std::size_t>(r);
    CHECK(tempered[i] != logprobs[i]);
    CHECK(tempered[i] == -row_loss[i]);
    // fp64: z_token / T - logsumexp(z / T)
    double top = -1e300;
    for (std::int64_t v = 0; v < vocab; ++v)
      top = std::max(top, static_cast<double>(logits[i * vocab + v]) / 0.7);
    double sum = 0;
    for (std::int64_t v = 0; v < vocab; ++v)
      sum += std::exp(static_cast<double>(logits[i * vocab + v]) / 0.7 - top);
    const double want =
        static_cast<double>(logits[i * vocab + tokens[i]]) / 0.7 - top - std::log(sum);
    CHECK(tempered[i] == Approx(want).margin(1e-5));
  }
}
