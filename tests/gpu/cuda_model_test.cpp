// The whole tiny model on the CUDA backend against the CPU backend, from identical weights
// (the CPU model starts from the bf16-rounded initialisation the GPU computes with).
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "gpu_test_support.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/generation_engine.hpp"
#include "model/llama_model.hpp"
#include "numeric_support.hpp"
#include "train/adamw_optimizer.hpp"
#include "train/objectives/bradley_terry_loss.hpp"
#include "train/objectives/language_model_loss.hpp"
#include "training_logprobs.hpp"

using l3::model::BatchBuilder;
using l3::model::HeadKind;
using l3::model::LlamaModel;
using l3::test::rel_error;

namespace {
l3::model::Batch tiny_batch(l3::test::Random& rnd) {
  BatchBuilder b(2, 64, 0);
  for (const int len : {30, 20, 50}) {
    auto mask = std::vector<std::uint8_t>(static_cast<std::size_t>(len), 1);
    mask[0] = 0;
    REQUIRE(b.add(rnd.integers(static_cast<std::size_t>(len), 512), mask) >= 0);
  }
  return b.finish();
}

void round_parameters(LlamaModel& cpu) {
  for (float& x : cpu.parameters().as<float>()) x = l3::test::round_bf16(x);
}
}  // namespace

TEST_CASE("tiny model forward/backward matches the CPU backend", "[gpu][model]") {
  INFO("seed " << l3::test::test_seed());
  const auto config = l3::model::preset("tiny");
  l3::kernels::CpuOps cpu_ops;
  l3::cuda::CudaOps gpu_ops;
  LlamaModel cpu(config, HeadKind::language_model, cpu_ops);
  LlamaModel gpu(config, HeadKind::language_model, gpu_ops);
  cpu.initialize(42);
  gpu.initialize(42);
  round_parameters(cpu);
  l3::test::Random rnd(110);
  const auto batch = tiny_batch(rnd);
  const float scale = 1.0F / static_cast<float>(batch.counted_tokens());
  cpu.zero_gradients();
  gpu.zero_gradients();
  const auto lc = l3::train::LanguageModelLoss(cpu).forward_backward(batch, scale);
  const auto lg = l3::train::LanguageModelLoss(gpu).forward_backward(batch, scale);
  CHECK(lg.tokens == lc.tokens);
  CHECK(lg.loss == Approx(lc.loss).epsilon(1e-2));
  for (const auto& t : cpu.layout().tensors()) {
    INFO(t.name);
    const auto gc = cpu.gradient(t.name).as<float>();
    const auto gg = l3::test::download(gpu_ops, gpu.gradient(t.name));
    CHECK(rel_error(gg, std::vector<float>(gc.begin(), gc.end())) < 5e-2);
  }
}

TEST_CASE("a few training steps follow the CPU loss trajectory", "[gpu][model]") {
  INFO("seed " << l3::test::test_seed());
  const auto config = l3::model::preset("tiny");
  l3::kernels::CpuOps cpu_ops;
  l3::cuda::CudaOps gpu_ops;
  LlamaModel cpu(config, HeadKind::language_model, cpu_ops);
  LlamaModel gpu(config, HeadKind::language_model, gpu_ops);
  cpu.initialize(7);
  gpu.initialize(7);
  round_parameters(cpu);
  l3::train::AdamW cpu_opt(cpu_ops, cpu.layout(), {});
  l3::train::AdamW gpu_opt(gpu_ops, gpu.layout(), {});
  l3::test::Random rnd(111);
  const auto batch = tiny_batch(rnd);
  const float scale = 1.0F / static_cast<float>(batch.counted_tokens());
  for (int step = 0; step < 10; ++step) {
    cpu.zero_gradients();
    gpu.zero_gradients();
    const double lc = l3::train::LanguageModelLoss(cpu).forward_backward(batch, scale).loss * scale;
    const double lg = l3::train::LanguageModelLoss(gpu).forward_backward(batch, scale).loss * scale;
    INFO("step " << step << " cpu " << lc << " gpu " << lg);
    CHECK(lg == Approx(lc).epsilon(3e-2));
    cpu_opt.step(cpu.master_weights(), cpu.weight_copy(), cpu.gradients(), 1e-3F, 1.0F);
    gpu_opt.step(gpu.master_weights(), gpu.weight_copy(), gpu.gradients(), 1e-3F, 1.0F);
  }
}

TEST_CASE("reward model forward/backward matches the CPU backend", "[gpu][model]") {
  INFO("seed " << l3::test::test_seed());
  const auto config = l3::model::preset("tiny");
  l3::kernels::CpuOps cpu_ops;
  l3::cuda::CudaOps gpu_ops;
  LlamaModel cpu(config, HeadKind::reward, cpu_ops);
  LlamaModel gpu(config, HeadKind::reward, gpu_ops);
  cpu.initialize(3);
  gpu.initialize(3);
  round_parameters(cpu);
  l3::test::Random rnd(112);
  BatchBuilder b(4, 40, 0);
  for (int p = 0; p < 3; ++p)
    REQUIRE(b.add_pair(rnd.integers(20, 512), rnd.integers(15, 512), 0.1F));
  const auto batch = b.finish();
  cpu.zero_gradients();
  gpu.zero_gradients();
  const auto rc = l3::train::BradleyTerryLoss(cpu).forward_backward(batch, 1.0F / 3.0F, 0.01);
  const auto rg = l3::train::BradleyTerryLoss(gpu).forward_backward(batch, 1.0F / 3.0F, 0.01);
  // All six scores at once: each alone may lie near zero (a tiny score head at initialisation),
  // where bf16's absolute error of a few 1e-4 is a large relative one (seed
  // 11242332353110254660: chosen scores of 0.008 to 0.03 off by 2.1%, all six by 0.7%).
  auto scores = [](const auto& r) {
    std::vector<float> all(r.chosen.begin(), r.chosen.end());
    all.insert(all.end(), r.rejected.begin(), r.rejected.end());
    return all;
  };
  REQUIRE(rg.rejected.size() == rc.rejected.size());
  for (std::size_t i = 0; i < rc.chosen.size(); ++i) {
    UNSCOPED_INFO("pair " << i << ": chosen " << rg.chosen[i] << " (CPU " << rc.chosen[i]
                          << "), rejected " << rg.rejected[i] << " (CPU " << rc.rejected[i] << ")");
  }
  CHECK(rel_error(scores(rg), scores(rc)) < 2e-2);
  CHECK(rg.stats.loss == Approx(rc.stats.loss).epsilon(1e-2));
  const auto gc = cpu.gradient("score.weight").as<float>();
  CHECK(rel_error(l3::test::download(gpu_ops, gpu.gradient("score.weight")),
                  std::vector<float>(gc.begin(), gc.end())) < 5e-2);
}

TEST_CASE("LoRA adapters with dropout: forward/backward matches the CPU backend",
          "[gpu][model][lora]") {
  INFO("seed " << l3::test::test_seed());
  const auto config = l3::model::preset("tiny");
  l3::model::ModelOptions options;
  options.lora.rank = 4;
  options.lora.alpha = 8.0;
  options.lora.dropout = 0.1;  // the shared mask: both backends drop the same elements
  l3::kernels::CpuOps cpu_ops;
  l3::cuda::CudaOps gpu_ops;
  LlamaModel cpu(config, HeadKind::language_model, cpu_ops, options);
  LlamaModel gpu(config, HeadKind::language_model, gpu_ops, options);
  cpu.initialize(5);
  gpu.initialize(5);
  round_parameters(cpu);
  // B away from zero, so that every adapter path carries signal; the same bf16 values on both.
  l3::test::Random rnd(113);
  auto adapters = rnd.normal(static_cast<std::size_t>(cpu.trainable_layout().total()), 0.05F);
  adapters = l3::test::round_bf16(adapters);
  cpu.load_adapters(adapters);
  gpu.load_adapters(adapters);
  CHECK(gpu.gradients().numel() == gpu.trainable_layout().total());
  const auto batch = tiny_batch(rnd);
  const float scale = 1.0F / static_cast<float>(batch.counted_tokens());
  cpu.zero_gradients();
  gpu.zero_gradients();
  cpu.set_dropout_draw({.seed = 21});
  gpu.set_dropout_draw({.seed = 21});
  const auto lc = l3::train::LanguageModelLoss(cpu).forward_backward(batch, scale);
  const auto lg = l3::train::LanguageModelLoss(gpu).forward_backward(batch, scale);
  CHECK(lg.loss == Approx(lc.loss).epsilon(1e-2));
  for (const auto& t : cpu.trainable_layout().tensors()) {
    INFO(t.name);
    const auto gc = cpu.gradient(t.name).as<float>();
    const auto gg = l3::test::download(gpu_ops, gpu.gradient(t.name));
    CHECK(rel_error(gg, std::vector<float>(gc.begin(), gc.end())) < 5e-2);
  }
}

TEST_CASE("the generation engine on the device follows the CPU model", "[gpu][model][generate]") {
  INFO("seed " << l3::test::test_seed());
  const auto config = l3::model::preset("tiny");
  l3::kernels::CpuOps cpu_ops;
  l3::cuda::CudaOps gpu_ops;
  LlamaModel cpu(config, HeadKind::language_model, cpu_ops);
  LlamaModel gpu(config, HeadKind::language_model, gpu_ops);
  cpu.initialize(12);
  gpu.initialize(12);
  round_parameters(cpu);
  l3::test::Random rnd(113);
  std::vector<l3::model::GenerationRequest> requests;
  for (const std::size_t length : {7U, 19U, 3U, 11U}) {
    const auto prompt = rnd.integers(length, 512);
    for (std::int64_t sample = 0; sample < 2; ++sample) {
      requests.push_back({.record = static_cast<std::int64_t>(requests.size()),
                          .sample = sample,
                          .prompt = prompt,
                          .max_new = 6});
    }
  }
  for (const double temperature : {0.0, 0.8}) {
    INFO("temperature " << temperature);
    // 3 slots for 8 requests, prompts in chunks of 8: every path of the engine on the device
    l3::model::GenerationEngine engine(gpu, {.slots = 3, .capacity = 32, .prefill_chunk = 8},
                                       {.temperature = temperature, .top_p = 0.95, .seed = 3});
    std::size_t next = 0;
    std::vector<l3::model::GenerationOutput> outputs;
    engine.run(
        [&]() -> std::optional<l3::model::GenerationRequest> {
          if (next == requests.size()) return std::nullopt;
          return requests[next++];
        },
        [&](l3::model::GenerationOutput&& out) { outputs.push_back(std::move(out)); });
    REQUIRE(outputs.size() == requests.size());
    for (const auto& out : outputs) {
      const auto& request = requests[static_cast<std::size_t>(out.record)];
      REQUIRE(out.tokens.size() == 6);
      std::vector<std::int32_t> sequence = request.prompt;
      sequence.insert(sequence.end(), out.tokens.begin(), out.tokens.end());
      // the device's log-probabilities of its own tokens, against the CPU's training forward on
      // the same weights: within bf16 activations' tolerance
      const auto expected = l3::test::training_logprobs(cpu, sequence, request.prompt.size());
      for (std::size_t t = 0; t < out.tokens.size(); ++t) {
        INFO("record " << out.record << " token " << t << ": " << out.logprobs[t] << " vs "
                       << expected[t]);
        CHECK(std::abs(out.logprobs[t] - expected[t]) <= 0.05F + 0.02F * std::abs(expected[t]));
      }
    }
  }
}

namespace {
// Every output of an engine run, by (record, sample).
std::map<std::pair<std::int64_t, std::int64_t>, l3::model::GenerationOutput> run_engine(
    l3::model::GenerationEngine& engine,
    const std::vector<l3::model::GenerationRequest>& requests) {
  std::size_t next = 0;
  std::map<std::pair<std::int64_t, std::int64_t>, l3::model::GenerationOutput> outputs;
  engine.run(
      [&]() -> std::optional<l3::model::GenerationRequest> {
        if (next == requests.size()) return std::nullopt;
        return requests[next++];
      },
      [&](l3::model::GenerationOutput&& out) {
        outputs[{out.record, out.sample}] = std::move(out);
      });
  return outputs;
}
}  // namespace

TEST_CASE("decoding by CUDA graphs gives the tokens and log-probabilities of decoding without",
          "[gpu][model][generate][graphs]") {
  using l3::model::DecodePath;
  INFO("seed " << l3::test::test_seed());
  const auto config = l3::model::preset("tiny");
  l3::cuda::CudaOps gpu_ops;
  LlamaModel gpu(config, HeadKind::language_model, gpu_ops);
  gpu.initialize(12);
  l3::test::Random rnd(131);
  // 7 requests of different lengths on 5 slots: decoding passes of 5, 4, 3 (a bucket of 4 with a
  // pad row), 2 and 1 rows as sequences end at different times, and passes that mix prefill
  // with decoding (run op by op in every mode).
  std::vector<l3::model::GenerationRequest> requests;
  const std::vector<std::size_t> lengths{5, 9, 3, 12, 6, 4, 8};
  const std::vector<std::int64_t> news{9, 3, 12, 5, 7, 2, 10};
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    requests.push_back({.record = static_cast<std::int64_t>(r),
                        .sample = static_cast<std::int64_t>(r % 2),
                        .prompt = rnd.integers(lengths[r], 512),
                        .max_new = news[r]});
  }
  const l3::model::EngineShape base{.slots = 5, .capacity = 40, .prefill_chunk = 8};
  for (const double temperature : {0.0, 0.9}) {
    INFO("temperature " << temperature);
    const l3::model::SamplingSettings sampling{
        .temperature = temperature, .top_p = 0.9, .seed = 5, .stop_tokens = {7, 100, 300}};
    l3::model::EngineShape shape = base;
    shape.decode = DecodePath::graphs;
    l3::model::GenerationEngine graphs(gpu, shape, sampling);
    REQUIRE(graphs.shape().decode == DecodePath::graphs);
    shape.decode = DecodePath::bucketed;
    l3::model::GenerationEngine bucketed(gpu, shape, sampling);
    shape.decode = DecodePath::per_pass;
    l3::model::GenerationEngine per_pass(gpu, shape, sampling);

    const auto replayed = run_engine(graphs, requests);
    CHECK(graphs.graphs_recorded() >= 3);  // buckets 4, 2 and 1 at least
    CHECK(graphs.graph_replays() > graphs.graphs_recorded());
    const auto eager = run_engine(bucketed, requests);
    CHECK(bucketed.graphs_recorded() == 0);
    const auto reference = run_engine(per_pass, requests);
    REQUIRE(replayed.size() == requests.size());
    REQUIRE(eager.size() == requests.size());
    REQUIRE(reference.size() == requests.size());
    for (const auto& [key, out] : replayed) {
      INFO("record " << key.first);
      // The graphs replay the bucketed passes' work: the same bits.
      const auto& same = eager.at(key);
      CHECK(out.tokens == same.tokens);
      CHECK(out.logprobs == same.logprobs);
      CHECK(out.stopped == same.stopped);
      CHECK(out.stop_token == same.stop_token);
      // Per pass the decode attention splits the keys by the longest row rather than by the
      // capacity: the same tokens, log-probabilities within fp32 summation order of each other.
      const auto& other = reference.at(key);
      CHECK(out.tokens == other.tokens);
      REQUIRE(out.logprobs.size() == other.logprobs.size());
      for (std::size_t t = 0; t < out.logprobs.size(); ++t) {
        CHECK(std::abs(out.logprobs[t] - other.logprobs[t]) <= 2e-2F);
      }
    }
    // A second run replays the graphs already recorded: the same outputs again.
    const std::int64_t recorded = graphs.graphs_recorded();
    const auto again = run_engine(graphs, requests);
    CHECK(graphs.graphs_recorded() == recorded);
    for (const auto& [key, out] : again) {
      CHECK(out.tokens == replayed.at(key).tokens);
      CHECK(out.logprobs == replayed.at(key).logprobs);
    }
  }
}

TEST_CASE("L3_DECODE_GRAPHS picks the decode path and the CPU backend decodes per pass",
          "[gpu][model][generate][graphs]") {
  using l3::model::DecodePath;
  const auto config = l3::model::preset("tiny");
  l3::cuda::CudaOps gpu_ops;
  l3::kernels::CpuOps cpu_ops;
  LlamaModel gpu(config, HeadKind::language_model, gpu_ops);
  LlamaModel cpu(config, HeadKind::language_model, cpu_ops);
  const l3::model::EngineShape shape{.slots = 2, .capacity = 16};
  const auto path = [&](LlamaModel& model, const char* value) {
    if (value == nullptr) {
      unsetenv("L3_DECODE_GRAPHS");
    } else {
      setenv("L3_DECODE_GRAPHS", value, 1);
    }
    const l3::model::GenerationEngine engine(model, shape, {});
    unsetenv("L3_DECODE_GRAPHS");
    return engine.shape().decode;
  };
  CHECK(path(gpu, nullptr) == DecodePath::graphs);
  CHECK(path(gpu, "1") == DecodePath::graphs);
  CHECK(path(gpu, "0") == DecodePath::per_pass);
  CHECK(path(gpu, "eager") == DecodePath::bucketed);
  CHECK_THROWS_WITH(path(gpu, "yes"), Catch::Contains("L3_DECODE_GRAPHS"));
  CHECK(path(cpu, nullptr) == DecodePath::per_pass);
  CHECK(l3::model::decode_bucket(3, 64) == 4);
  CHECK(l3::model::decode_bucket(33, 64) == 64);
  CHECK(l3::model::decode_bucket(5, 5) == 5);
  CHECK(l3::model::decode_bucket(1, 5) == 1);
}

TEST_CASE("decoding graphs with LoRA adapters replay on weights changed in place",
          "[gpu][model][generate][graphs][lora]") {
  using l3::model::DecodePath;
  INFO("seed " << l3::test::test_seed());
  const auto config = l3::model::preset("tiny");
  l3::model::ModelOptions options;
  options.lora.rank = 4;
  options.lora.alpha = 8.0;
  l3::cuda::CudaOps gpu_ops;
  LlamaModel gpu(config, HeadKind::language_model, gpu_ops, options);
  gpu.initialize(7);
  l3::test::Random rnd(137);
  const auto total = static_cast<std::size_t>(gpu.trainable_layout().total());
  gpu.load_adapters(l3::test::round_bf16(rnd.normal(total, 0.05F)));
  std::vector<l3::model::GenerationRequest> requests;
  for (std::int64_t r = 0; r < 4; ++r) {
    requests.push_back({.record = r,
                        .prompt = rnd.integers(static_cast<std::size_t>(3 + 2 * r), 512),
                        .max_new = 4 + 2 * r});
  }
  const l3::model::SamplingSettings sampling{.temperature = 0.7, .seed = 9};
  l3::model::EngineShape shape{.slots = 3, .capacity = 24, .prefill_chunk = 8};
  shape.decode = DecodePath::graphs;
  l3::model::GenerationEngine graphs(gpu, shape, sampling);
  shape.decode = DecodePath::bucketed;
  l3::model::GenerationEngine bucketed(gpu, shape, sampling);
  const auto compare = [&](const auto& a, const auto& b) {
    REQUIRE(a.size() == requests.size());
    REQUIRE(b.size() == requests.size());
    for (const auto& [key, out] : a) {
      INFO("record " << key.first);
      CHECK(out.tokens == b.at(key).tokens);
      CHECK(out.logprobs == b.at(key).logprobs);
    }
  };
  const auto first = run_engine(graphs, requests);
  compare(first, run_engine(bucketed, requests));
  CHECK(graphs.graphs_recorded() > 0);
  const std::int64_t replays = graphs.graph_replays();
  CHECK(replays > 0);
  // New adapter weights in the same buffers (an RL step): the graphs read them as they are now
  // (recorded again only where the upload replaced the backend's scratch).
  gpu.load_adapters(l3::test::round_bf16(rnd.normal(total, 0.2F)));
  const auto second = run_engine(graphs, requests);
  CHECK(graphs.graph_replays() > replays);
  compare(second, run_engine(bucketed, requests));
  bool changed = false;
  for (const auto& [key, out] : second) changed = changed || out.logprobs != first.at(key).logprobs;
  CHECK(changed);
}
