#include "kernels/cpu/attention.hpp"

#include "catch.hpp"
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
