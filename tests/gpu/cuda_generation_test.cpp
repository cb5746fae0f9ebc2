// Generation's ops of the CUDA backend against the CPU reference (kernels/cpu/decode_attention.cpp,
// token_sampling.cpp) on the same bf16-rounded inputs: the KV cache's writes bit for bit, decode
// attention within bf16 rounding of its output, the sampled tokens exactly.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "catch.hpp"
#include "gpu_test_support.hpp"
#include "kernels/cpu/decode_attention.hpp"
#include "kernels/cpu/token_sampling.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/ops.hpp"
#include "numeric_support.hpp"

using l3::kernels::DType;
using l3::test::download;
using l3::test::expect_close;
using l3::test::poisoned;
using l3::test::round_bf16;
using l3::test::upload;
using l3::test::upload_raw;

namespace {

// The largest |actual - expected| over the elements (NaN: infinity).
double max_abs_error(const std::vector<float>& actual, const std::vector<float>& expected) {
  double worst = 0.0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double d = std::abs(static_cast<double>(actual[i]) - expected[i]);
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

}  // namespace

TEST_CASE("kv_cache_write and decode_attention against the CPU kernels", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // group 1, 2, 4 query heads per KV head; head_dim 64 (16-byte loads) and 36 (one at a time)
  const int group = GENERATE(1, 2, 4);
  const int head_dim = GENERATE(64, 36);
  const int n_kv_heads = 2;
  const int n_heads = group * n_kv_heads;
  INFO("group " << group << ", head_dim " << head_dim);
  const std::int64_t slots = 4, capacity = 700;
  const std::int64_t kv_row = std::int64_t{n_kv_heads} * head_dim;
  const std::int64_t q_row = std::int64_t{n_heads} * head_dim;
  const l3::kernels::cpu::CacheShape cache{.slots = slots, .capacity = capacity};
  const l3::kernels::cpu::AttentionHeads heads{n_heads, n_kv_heads, head_dim};
  l3::test::Random rnd(200);

  // A cache already holding random prefixes in every slot (what earlier steps wrote).
  const std::int64_t cache_numel = slots * capacity * kv_row;
  auto k_cache = round_bf16(rnd.normal(static_cast<std::size_t>(cache_numel)));
  auto v_cache = round_bf16(rnd.normal(static_cast<std::size_t>(cache_numel)));
  const l3::kernels::Shape cache_shape{slots, capacity, n_kv_heads, head_dim};
  const auto gk_cache = upload(gpu, k_cache, cache_shape);
  const auto gv_cache = upload(gpu, v_cache, cache_shape);

  // This step's rows: one new token of slot 0 at position 0 (its first), a long sequence in
  // slot 1 (600 keys: several splits of the keys), five rows of one sequence continuing a cached
  // prefix of 100 positions in slot 2 (a chunk of a prompt: each row sees the ones before it),
  // and slot 3 at position 37. Rows are in no particular order.
  const std::vector<std::int32_t> row_slots = {2, 1, 2, 0, 2, 3, 2, 2};
  const std::vector<std::int32_t> row_positions = {100, 599, 101, 0, 102, 37, 103, 104};
  const auto rows = static_cast<std::int64_t>(row_slots.size());
  const auto k = round_bf16(rnd.normal(static_cast<std::size_t>(rows * kv_row)));
  const auto v = round_bf16(rnd.normal(static_cast<std::size_t>(rows * kv_row)));
  const auto q = round_bf16(rnd.normal(static_cast<std::size_t>(rows * q_row)));
  const auto gslots = upload_raw(gpu, row_slots);
  const auto gpositions = upload_raw(gpu, row_positions);
  const auto gk = upload(gpu, k, {rows, n_kv_heads, head_dim});
  const auto gv = upload(gpu, v, {rows, n_kv_heads, head_dim});
  const auto gq = upload(gpu, q, {rows, n_heads, head_dim});

  l3::kernels::cpu::kv_cache_write(k_cache, v_cache, k, v, row_slots, row_positions, cache, heads);
  gpu.kv_cache_write({.k_cache = gk_cache.view(),
                      .v_cache = gv_cache.view(),
                      .k = gk.view(),
                      .v = gv.view(),
                      .slots = gslots.view(),
                      .positions = gpositions.view()});
  // Copies of bf16 values: bit for bit, the rest of the cache untouched.
  CHECK((download(gpu, gk_cache.view()) == k_cache));
  CHECK((download(gpu, gv_cache.view()) == v_cache));

  std::vector<float> out(static_cast<std::size_t>(rows * q_row));
  l3::kernels::cpu::decode_attention(out, q, k_cache, v_cache, row_slots, row_positions, cache,
                                     heads);
  const auto gout = poisoned(gpu, {rows, n_heads, head_dim});
  gpu.decode_attention({.out = gout.view(),
                        .q = gq.view(),
                        .k_cache = gk_cache.view(),
                        .v_cache = gv_cache.view(),
                        .slots = gslots.view(),
                        .positions = gpositions.view(),
                        .max_keys = 600});
  const auto got = download(gpu, gout.view());
  INFO("max |error| " << max_abs_error(got, out));
  expect_close("out", got, out, 1e-2);
  // Each element within a bf16 rounding of the CPU's value, and a little for fp32 sums.
  for (std::size_t e = 0; e < out.size(); ++e) {
    INFO("element " << e);
    REQUIRE(std::abs(got[e] - out[e]) <= std::abs(out[e]) * 0x1p-8F + 1e-3F);
  }

  // The short rows alone (one block per row and KV head, no merge), positions also on the host.
  const std::vector<std::int32_t> short_slots = {2, 0, 2, 3, 2};
  const std::vector<std::int32_t> short_positions = {104, 0, 101, 37, 100};
  const auto s_rows = static_cast<std::int64_t>(short_slots.size());
  std::vector<float> s_q;
  std::vector<float> s_out;
  for (std::int32_t i : {7, 3, 2, 5, 0}) {  // the rows above with these slots and positions
    s_q.insert(s_q.end(), q.begin() + i * q_row, q.begin() + (i + 1) * q_row);
    s_out.insert(s_out.end(), out.begin() + i * q_row, out.begin() + (i + 1) * q_row);
  }
  const auto gs_slots = upload_raw(gpu, short_slots);
  const auto gs_positions = upload_raw(gpu, short_positions);
  const auto gs_q = upload(gpu, s_q, {s_rows, n_heads, head_dim});
  const auto gs_out = poisoned(gpu, {s_rows, n_heads, head_dim});
  gpu.decode_attention({.out = gs_out.view(),
                        .q = gs_q.view(),
                        .k_cache = gk_cache.view(),
                        .v_cache = gv_cache.view(),
                        .slots = gs_slots.view(),
                        .positions = gs_positions.view(),
                        .max_keys = 105,
                        .host_positions = short_positions});
  const auto s_got = download(gpu, gs_out.view());
  INFO("max |error| (short rows) " << max_abs_error(s_got, s_out));
  expect_close("out (short rows)", s_got, s_out, 1e-2);

  // A position outside the cache is refused where the host knows it.
  const std::vector<std::int32_t> beyond = {104, 0, 101, 700, 100};
  CHECK_THROWS(gpu.decode_attention({.out = gs_out.view(),
                                     .q = gs_q.view(),
                                     .k_cache = gk_cache.view(),
                                     .v_cache = gv_cache.view(),
                                     .slots = gs_slots.view(),
                                     .positions = gs_positions.view(),
                                     .max_keys = 105,
                                     .host_positions = beyond}));
}

namespace {

// The sampling rule in fp64, written from its statement in kernels/ops.hpp: each candidate's
// probability of being drawn (0 outside the kept set).
std::vector<double> kept_probabilities(const std::vector<float>& logits, std::int64_t candidates,
                                       const l3::kernels::cpu::SamplingRule& rule) {
  const auto n = static_cast<std::size_t>(candidates);
  const double max = *std::max_element(logits.begin(), logits.begin() + candidates);
  std::vector<double> w(n);
  for (std::size_t j = 0; j < n; ++j) w[j] = std::exp((logits[j] - max) / rule.temperature);
  std::vector<std::size_t> order(n);
  for (std::size_t j = 0; j < n; ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return w[a] > w[b];  // stable: lower ids first among equal weights
  });
  if (rule.top_k > 0 && static_cast<std::size_t>(rule.top_k) < n) {
    order.resize(static_cast<std::size_t>(rule.top_k));
  }
  if (rule.top_p < 1.0) {
    double total = 0.0;
    for (const std::size_t j : order) total += w[j];
    double mass = 0.0;
    std::size_t count = 0;
    while (count < order.size() && (count == 0 || mass < rule.top_p * total)) {
      mass += w[order[count++]];
    }
    order.resize(count);
  }
  double total = 0.0;
  for (const std::size_t j : order) total += w[j];
  std::vector<double> p(n, 0.0);
  for (const std::size_t j : order) p[j] = w[j] / total;
  return p;
}

struct Sampled {
  std::vector<std::int32_t> tokens;
  std::vector<float> logprobs;
};

// tokens and logprobs of both backends for rows of logits (rows, vocab) and their uniforms.
Sampled sample_on_gpu(l3::cuda::CudaOps& gpu, const l3::kernels::Buffer& logits,
                      const l3::kernels::Buffer& uniforms,
                      const l3::kernels::cpu::SamplingRule& rule, std::int64_t vocab_limit) {
  const std::int64_t rows = logits.view().dim(0);
  const auto tokens =
      upload_raw(gpu, std::vector<std::int32_t>(static_cast<std::size_t>(rows), -1));
  const auto logprobs = poisoned(gpu, rows, DType::f32);
  gpu.sample_tokens({.tokens = tokens.view(),
                     .logprobs = logprobs.view(),
                     .logits = logits.view(),
                     .uniforms = uniforms.view(),
                     .temperature = rule.temperature,
                     .top_p = rule.top_p,
                     .top_k = rule.top_k,
                     .vocab_limit = vocab_limit,
                     .logprob_scale = rule.logprob_scale});
  return {l3::test::download_raw<std::int32_t>(gpu, tokens.view()), download(gpu, logprobs.view())};
}

Sampled sample_on_cpu(const std::vector<float>& logits, const std::vector<double>& uniforms,
                      std::int64_t vocab, const l3::kernels::cpu::SamplingRule& rule,
                      std::int64_t vocab_limit) {
  Sampled s{std::vector<std::int32_t>(uniforms.size()), std::vector<float>(uniforms.size())};
  l3::kernels::cpu::sample_tokens(s.tokens, s.logprobs, logits, uniforms, vocab,
                                  vocab_limit > 0 ? vocab_limit : vocab, rule);
  return s;
}

}  // namespace

TEST_CASE("sample_tokens greedy: the CPU's first largest logit, the cross-entropy's logprob",
          "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // 5000: float4 rows (as the cross-entropy kernel reads them); 5001: one value at a time
  const std::int64_t vocab = GENERATE(5000, 5001);
  const std::int64_t vocab_limit = GENERATE(0, 4000);
  INFO("vocab " << vocab << ", vocab_limit " << vocab_limit);
  const std::int64_t rows = 16;
  l3::test::Random rnd(201);
  auto logits = rnd.normal(static_cast<std::size_t>(rows * vocab), 3.0F);
  const auto spots = rnd.integers(static_cast<std::size_t>(rows * 2), 3900);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = logits.data() + r * vocab;
    // ties for the largest: a copy of it before and after it (every other row), and a larger
    // logit past the candidates (vocab_limit ignores it; the logprob still counts it)
    const auto at = static_cast<std::size_t>(std::max_element(row, row + 3900) - row);
    if (r % 2 == 0) {
      row[spots[static_cast<std::size_t>(2 * r)]] = row[at];
      row[spots[static_cast<std::size_t>(2 * r + 1)]] = row[at];
    }
    row[vocab - 1] = row[at] + 1.0F;
  }
  std::vector<double> uniforms(static_cast<std::size_t>(rows), 0.5);
  const auto glogits = upload(gpu, logits, {rows, vocab}, DType::f32);
  const auto guniforms = upload_raw(gpu, uniforms);
  const l3::kernels::cpu::SamplingRule greedy{};
  const Sampled cpu = sample_on_cpu(logits, uniforms, vocab, greedy, vocab_limit);
  const Sampled got = sample_on_gpu(gpu, glogits, guniforms, greedy, vocab_limit);
  CHECK((got.tokens == cpu.tokens));
  const double error = max_abs_error(got.logprobs, cpu.logprobs);
  INFO("max |logprob error| " << error);
  CHECK(error <= 1e-5);

  // The cross-entropy kernel of the training forward on the same logits and tokens: its row
  // losses are the negated logprobs bit for bit.
  const auto gtargets = upload_raw(gpu, got.tokens);
  const auto losses = poisoned(gpu, rows, DType::f32);
  l3::cuda::softmax_cross_entropy(
      losses.view().as<float>().data(), nullptr, glogits.view().as<float>().data(),
      gtargets.view().as<std::int32_t>().data(), nullptr, rows, vocab, 1.0F, gpu.stream());
  const auto loss = download(gpu, losses.view());
  for (std::size_t r = 0; r < loss.size(); ++r) {
    INFO("row " << r);
    CHECK(got.logprobs[r] == -loss[r]);
  }
}

TEST_CASE("sample_tokens with temperature, top-k and top-p: the CPU's tokens", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // distinct logits (normal), and logits on a grid of 0.5 (many ties at every threshold)
  const bool ties = GENERATE(false, true);
  const std::int64_t vocab = 3000;
  const std::int64_t rows = 8;
  l3::test::Random rnd(202);
  auto logits = rnd.normal(static_cast<std::size_t>(rows * vocab), 2.0F);
  if (ties) {
    for (float& x : logits) x = std::round(x * 2.0F) / 2.0F;
  }
  std::vector<double> uniforms(static_cast<std::size_t>(rows));
  for (double& u : uniforms) u = rnd.uniform01();
  const auto glogits = upload(gpu, logits, {rows, vocab}, DType::f32);
  const auto guniforms = upload_raw(gpu, uniforms);
  double worst_logprob = 0.0;
  for (const double temperature : {0.7, 1.3}) {
    for (const std::int64_t top_k :
         {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{40}, vocab}) {
      for (const double top_p : {1.0, 0.9, 0.3}) {
        for (const std::int64_t vocab_limit : {std::int64_t{0}, std::int64_t{2500}}) {
          INFO("ties " << ties << ", temperature " << temperature << ", top_k " << top_k
                       << ", top_p " << top_p << ", vocab_limit " << vocab_limit);
          // raw log-probabilities, and tempered ones (GRPO's: of softmax(logits / T))
          for (const bool tempered : {false, true}) {
            // The scale touches the log-probabilities' statistics only: one rule per row set.
            if (tempered && (top_k != 0 || top_p != 1.0)) continue;
            INFO("tempered log-probabilities " << tempered);
            const l3::kernels::cpu::SamplingRule rule{
                .temperature = temperature,
                .top_p = top_p,
                .top_k = top_k,
                .logprob_scale = tempered ? l3::kernels::logit_scale(temperature) : 1.0F};
            const Sampled cpu = sample_on_cpu(logits, uniforms, vocab, rule, vocab_limit);
            const Sampled got = sample_on_gpu(gpu, glogits, guniforms, rule, vocab_limit);
            CHECK((got.tokens == cpu.tokens));
            const double error = max_abs_error(got.logprobs, cpu.logprobs);
            // Both sum a row's exponentials in fp32, in different orders; the CPU's order also
            // depends on its vector width (AVX-512 or AVX2 clone): 1.07e-5 seen on an AVX2-only
            // AMD EPYC, under 1e-5 with AVX-512. Log-probabilities here are about -7 to -12.
            CHECK(error <= 2e-5);
            worst_logprob = std::max(worst_logprob, error);
          }
        }
      }
    }
  }
  WARN("max |logprob error| " << worst_logprob);
}

TEST_CASE("sample_tokens draws each kept token with its probability", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // One row of 12 logits (a tie at 1.0, one at -0.5) repeated with evenly spread uniforms
  // (i + 0.5) / n: each token's count is within 1 of n times its probability under the rule.
  const std::vector<float> row = {0.3F, 1.0F,  -0.5F, 2.2F, 1.0F,  -3.0F,
                                  0.8F, -0.5F, 1.6F,  0.0F, -1.2F, 0.45F};
  const auto vocab = static_cast<std::int64_t>(row.size());
  const std::int64_t n = 400;
  std::vector<float> logits;
  std::vector<double> uniforms;
  for (std::int64_t i = 0; i < n; ++i) {
    logits.insert(logits.end(), row.begin(), row.end());
    uniforms.push_back((static_cast<double>(i) + 0.5) / static_cast<double>(n));
  }
  const auto glogits = upload(gpu, logits, {n, vocab}, DType::f32);
  const auto guniforms = upload_raw(gpu, uniforms);
  for (const auto& rule :
       {l3::kernels::cpu::SamplingRule{.temperature = 1.0},
        l3::kernels::cpu::SamplingRule{.temperature = 0.5, .top_k = 5},
        l3::kernels::cpu::SamplingRule{.temperature = 1.0, .top_k = 4},
        l3::kernels::cpu::SamplingRule{.temperature = 2.0, .top_p = 0.8},
        l3::kernels::cpu::SamplingRule{.temperature = 1.0, .top_p = 0.5},
        l3::kernels::cpu::SamplingRule{.temperature = 1.5, .top_p = 0.7, .top_k = 6}}) {
    INFO("temperature " << rule.temperature << ", top_k " << rule.top_k << ", top_p "
                        << rule.top_p);
    const Sampled got = sample_on_gpu(gpu, glogits, guniforms, rule, 0);
    CHECK((got.tokens == sample_on_cpu(logits, uniforms, vocab, rule, 0).tokens));
    const std::vector<double> p = kept_probabilities(row, vocab, rule);
    std::vector<std::int64_t> counts(static_cast<std::size_t>(vocab), 0);
    for (const std::int32_t t : got.tokens) {
      REQUIRE(t >= 0);
      REQUIRE(t < vocab);
      ++counts[static_cast<std::size_t>(t)];
    }
    for (std::size_t j = 0; j < p.size(); ++j) {
      INFO("token " << j << ": " << counts[j] << " of " << n << ", probability " << p[j]);
      CHECK(std::abs(static_cast<double>(counts[j]) - p[j] * static_cast<double>(n)) <= 1.0);
    }
  }
}

TEST_CASE("a captured op replays on the inputs of the moment and capture-unsafe calls are errors",
          "[gpu][graphs]") {
  l3::cuda::CudaOps gpu;
  REQUIRE(gpu.can_capture());
  const std::int64_t rows = 4, vocab = 300;
  l3::test::Random rnd(29);
  const auto logits = upload(gpu, rnd.uniform(static_cast<std::size_t>(rows * vocab), -3.0F, 3.0F),
                             {rows, vocab}, DType::f32);
  const auto uniforms = upload_raw(gpu, std::vector<double>(static_cast<std::size_t>(rows), 0.5));
  const auto tokens =
      upload_raw(gpu, std::vector<std::int32_t>(static_cast<std::size_t>(rows), -1));
  const auto logprobs = poisoned(gpu, rows, DType::f32);
  const auto sample = [&] {
    gpu.sample_tokens({.tokens = tokens.view(),
                       .logprobs = logprobs.view(),
                       .logits = logits.view(),
                       .uniforms = uniforms.view(),
                       .temperature = 0.7,
                       .top_p = 0.9});
  };
  // The op's workspace does not exist before its first eager run: recording it would allocate.
  CHECK_THROWS_WITH(
      static_cast<void>(gpu.capture(sample)),
      Catch::Contains("cudaErrorStreamCaptureUnsupported") || Catch::Contains("capture"));
  sample();  // eager: sizes the scratch
  const auto eager_tokens = l3::test::download_raw<std::int32_t>(gpu, tokens.view());
  const auto graph = gpu.capture(sample);
  REQUIRE(graph->valid());
  // New inputs in the same buffers: the replay samples them, as the eager op does.
  for (const std::uint32_t stream : {31U, 37U}) {
    l3::test::Random next(stream);
    gpu.copy(logits.view(), l3::kernels::ConstTensorView(std::span<const float>(next.uniform(
                                static_cast<std::size_t>(rows * vocab), -3.0F, 3.0F))));
    sample();
    const auto expected_tokens = l3::test::download_raw<std::int32_t>(gpu, tokens.view());
    const auto expected_logprobs = download(gpu, logprobs.view());
    gpu.copy(tokens.view(), l3::kernels::ConstTensorView(std::span<const std::int32_t>(
                                std::vector<std::int32_t>(static_cast<std::size_t>(rows), -1))));
    graph->replay();
    CHECK(l3::test::download_raw<std::int32_t>(gpu, tokens.view()) == expected_tokens);
    CHECK(download(gpu, logprobs.view()) == expected_logprobs);
  }
  CHECK(eager_tokens.size() == static_cast<std::size_t>(rows));
  // An eager op that needs more scratch replaces it: the graph is stale and refuses to replay.
  const std::int64_t more = 4096;
  const auto big = upload(gpu, std::vector<float>(static_cast<std::size_t>(more * 8), 0.0F),
                          {more, 8}, DType::f32);
  const auto big_uniforms =
      upload_raw(gpu, std::vector<double>(static_cast<std::size_t>(more), 0.5));
  const auto big_tokens =
      upload_raw(gpu, std::vector<std::int32_t>(static_cast<std::size_t>(more), -1));
  gpu.sample_tokens({.tokens = big_tokens.view(),
                     .logits = big.view(),
                     .uniforms = big_uniforms.view(),
                     .temperature = 0.7,
                     .top_p = 0.9});
  gpu.synchronize();
  CHECK_FALSE(graph->valid());
  CHECK_THROWS_WITH(graph->replay(), Catch::Contains("scratch"));
}

TEST_CASE("rope_kv_cache_write: rope(q), rope(k) and kv_cache_write in one launch, bit for bit",
          "[gpu][graphs]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // head_dim 64: the unfused rope's 16-byte path; 36: its one-pair path
  const int head_dim = GENERATE(64, 36);
  INFO("head_dim " << head_dim);
  const int n_heads = 4, n_kv_heads = 2, pairs = head_dim / 2;
  const std::int64_t slots = 3, capacity = 16;
  l3::test::Random rnd(211);
  // rows of slots 1, 0 and 2 at positions 5, 15 and 0, and a pad row outside the cache (-1)
  const std::vector<std::int32_t> row_slots = {1, -1, 0, 2};
  const std::vector<std::int32_t> row_positions = {5, 0, 15, 0};
  const auto rows = static_cast<std::int64_t>(row_slots.size());
  const auto values = [&](std::int64_t n) {
    return round_bf16(rnd.normal(static_cast<std::size_t>(n)));
  };
  const auto q = values(rows * n_heads * head_dim);
  const auto k = values(rows * n_kv_heads * head_dim);
  const auto v = values(rows * n_kv_heads * head_dim);
  const auto k_cache = values(slots * capacity * n_kv_heads * head_dim);
  const auto v_cache = values(slots * capacity * n_kv_heads * head_dim);
  const auto cos = rnd.uniform(static_cast<std::size_t>(capacity * pairs));
  const auto sin = rnd.uniform(static_cast<std::size_t>(capacity * pairs));
  const auto gcos = upload(gpu, cos, {capacity, pairs}, DType::f32);
  const auto gsin = upload(gpu, sin, {capacity, pairs}, DType::f32);
  const auto gslots = upload_raw(gpu, row_slots);
  const auto gpositions = upload_raw(gpu, row_positions);
  const auto gv = upload(gpu, v, {rows, n_kv_heads, head_dim});
  const l3::kernels::Shape cache_shape{slots, capacity, n_kv_heads, head_dim};
  struct State {
    l3::kernels::Buffer q, k, k_cache, v_cache;
  };
  const auto fresh = [&] {
    return State{upload(gpu, q, {rows, n_heads, head_dim}),
                 upload(gpu, k, {rows, n_kv_heads, head_dim}), upload(gpu, k_cache, cache_shape),
                 upload(gpu, v_cache, cache_shape)};
  };
  const State unfused = fresh();
  gpu.rope({.x = unfused.q.view(),
            .positions = gpositions.view(),
            .cos = gcos.view(),
            .sin = gsin.view()});
  gpu.rope({.x = unfused.k.view(),
            .positions = gpositions.view(),
            .cos = gcos.view(),
            .sin = gsin.view()});
  gpu.kv_cache_write({.k_cache = unfused.k_cache.view(),
                      .v_cache = unfused.v_cache.view(),
                      .k = unfused.k.view(),
                      .v = gv.view(),
                      .slots = gslots.view(),
                      .positions = gpositions.view()});
  const State fused = fresh();
  gpu.rope_kv_cache_write({.q = fused.q.view(),
                           .k = fused.k.view(),
                           .k_cache = fused.k_cache.view(),
                           .v_cache = fused.v_cache.view(),
                           .v = gv.view(),
                           .slots = gslots.view(),
                           .positions = gpositions.view(),
                           .cos = gcos.view(),
                           .sin = gsin.view()});
  const auto fq = download(gpu, fused.q.view());
  CHECK(fq == download(gpu, unfused.q.view()));
  CHECK(fq != q);  // rotated
  CHECK(download(gpu, fused.k.view()) == download(gpu, unfused.k.view()));
  const auto fk_cache = download(gpu, fused.k_cache.view());
  const auto fv_cache = download(gpu, fused.v_cache.view());
  CHECK(fk_cache == download(gpu, unfused.k_cache.view()));
  CHECK(fv_cache == download(gpu, unfused.v_cache.view()));
  // Slot 1 position 5 holds row 0's value heads; the pad row wrote nothing.
  const std::int64_t kv_row = std::int64_t{n_kv_heads} * head_dim;
  const auto at = static_cast<std::size_t>((1 * capacity + 5) * kv_row);
  CHECK(std::equal(v.begin(), v.begin() + kv_row,
                   fv_cache.begin() + static_cast<std::ptrdiff_t>(at)));
  std::size_t changed = 0;
  for (std::size_t e = 0; e < fv_cache.size(); ++e) changed += fv_cache[e] != v_cache[e] ? 1 : 0;
  CHECK(changed <= static_cast<std::size_t>(3 * kv_row));  // the three rows in the cache only
}
