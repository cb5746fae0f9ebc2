// Generation benchmark: the batched engine (model/generation_engine.hpp) on the mid model or on
// the Llama-3.2-1B shape (random weights).
//
//   l3-bench-generate [--quick] [--rehearsal] [--backend cpu|cuda] [--model mid|llama3.2-1b]
//                     [--json FILE]
// --quick: fewer new tokens and one run of each; --rehearsal: the tiny preset model, short prompts
// and a small forward batch (the GPU check's rehearsal on the CUDA emulation; the same JSON);
// --model: mid (the default; decode at batch 1, 8 and 64) or llama3.2-1b (batch 1 and 64).
//
// Figures, each next to its baseline measured in the same run:
//   - decode tokens/s at each batch (the time of N new tokens less that of 1, so that the
//     prefill is not counted), with the decoding passes as CUDA graphs (DecodePath::graphs, the
//     default) and without (per_pass), where the backend captures; one engine per shape, run
//     once untimed (which records its graphs) and then timed;
//   - at batch 1 the ratio of the time a pass over the weights' bytes takes (a threaded sum of
//     the parameter buffer on the CPU; on CUDA half the time of a device copy of it, i.e. the
//     measured copy bandwidth; best of runs) to the time of one decoded token: decoding one
//     sequence reads every weight once per token, so 1.0 is the memory bound (goal >= 0.5, vLLM's
//     level, aiming at 0.7);
//   - at batch 64 the ratio to the training forward pass's tokens/s on the same model (a batch
//     of 4 x 512 tokens; goal >= 0.5);
//   - prefill tokens/s (8 prompts of 512 tokens, one new token each);
//   - multi-turn episodes (grpo --environment): 8 conversations of a 256-token prompt and 4
//     policy turns of 32 tokens, each turn followed by a 64-token message (the environment's),
//     with the engine continuing each sequence from its KV cache (GenerationEngine::run_turns)
//     against a generator without turns, which runs each turn as a new request whose prompt is
//     the whole conversation so far (prefilled again): the ratio of their times.
// (--rehearsal: prompts of 4 tokens and 3 new tokens, a forward batch of 2 x 32, prefill 4 x 32,
// episodes of 2 turns of 3 tokens after 4-token prompts, 2-token messages.)
// The 2-rank job's throughput against 1 rank is bench/generate_scaling.sh (the CLI batch job).
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench_stats.hpp"
#include "core/build_info.hpp"
#include "core/rng.hpp"
#include "core/timer.hpp"
#include "kernels/backend_options.hpp"
#include "kernels/backends.hpp"
#include "mid_model_inputs.hpp"
#include "model/batch.hpp"
#include "model/generation_engine.hpp"
#include "model/llama_model.hpp"

namespace {

using l3::model::GenerationEngine;
using l3::model::GenerationOutput;
using l3::model::GenerationRequest;
using l3::model::LlamaModel;
using nlohmann::json;

std::vector<std::int32_t> random_tokens(std::int64_t count, std::int64_t vocab,
                                        std::uint32_t stream) {
  const l3::core::CounterRng rng(5, l3::core::RngPurpose::test, stream);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>(rng.below(i, static_cast<std::uint64_t>(vocab)));
  }
  return tokens;
}

// Seconds for `batch` prompts of `prompt` tokens and `new_tokens` new tokens each (greedy, no
// stop), all in flight at once: the best of `repeats` runs on a fresh engine. A single timed run
// (--quick) comes after an untimed one: the first passes of a shape (allocations, GEMM plans)
// would otherwise count, and at batch 1 made 1 token take longer than 5 (--rehearsal --quick).
double generation_seconds(LlamaModel& model, int batch, std::int64_t prompt,
                          std::int64_t new_tokens, int repeats, l3::model::DecodePath decode) {
  double best = 1e30;
  GenerationEngine engine(model,
                          {.slots = batch,
                           .capacity = prompt + new_tokens,
                           .max_rows = batch * (prompt + new_tokens),
                           .decode = decode},
                          {});
  for (int r = -1; r < repeats; ++r) {  // the first run warms up (allocations, page faults)
    int next = 0;
    std::int64_t produced = 0;
    const l3::core::Stopwatch watch;
    engine.run(
        [&]() -> std::optional<GenerationRequest> {
          if (next == batch) return std::nullopt;
          const auto i = static_cast<std::uint32_t>(next++);
          return GenerationRequest{.record = i,
                                   .prompt = random_tokens(prompt, model.config().vocab_size, i),
                                   .max_new = new_tokens};
        },
        [&](GenerationOutput&& out) { produced += static_cast<std::int64_t>(out.tokens.size()); });
    model.ops().synchronize();
    if (r >= 0) best = std::min(best, watch.seconds());
    if (produced != std::int64_t{batch} * new_tokens) {
      throw std::runtime_error(fmt::format("{} tokens generated, {} expected", produced,
                                           std::int64_t{batch} * new_tokens));
    }
  }
  return best;
}

// The best time of a threaded pass that reads every parameter once (CPU), or of a device
// copy of the buffer (CUDA: reads and writes it, so the time is halved).
double weight_read_seconds(LlamaModel& model, int repeats) {
  const l3::kernels::TensorView params = model.parameters();
  double best = 1e30;
  if (model.ops().backend() == l3::kernels::Backend::cpu) {
    const auto values = params.as<float>();
    double sink = 0.0;
    for (int r = 0; r < repeats; ++r) {
      const l3::core::Stopwatch watch;
      // 64 independent sums per thread (vectorised): the loop runs at the memory's speed, not
      // at the latency of one chain of additions
      constexpr std::size_t kChains = 64;
      const std::size_t blocks = values.size() / kChains;
      float sum = 0.0F;
#pragma omp parallel reduction(+ : sum)
      {
        std::array<float, kChains> chains{};
#pragma omp for schedule(static)
        for (std::size_t b = 0; b < blocks; ++b) {
#pragma omp simd
          for (std::size_t j = 0; j < kChains; ++j) chains[j] += values[b * kChains + j];
        }
        for (const float c : chains) sum += c;
      }
      for (std::size_t i = blocks * kChains; i < values.size(); ++i) sum += values[i];
      best = std::min(best, watch.seconds());
      sink += sum;
    }
    if (sink == 12345.678) fmt::print("\n");  // keeps the sums
    return best;
  }
  l3::kernels::Buffer copy = model.ops().allocate(params.dtype(), params.numel());
  for (int r = 0; r < repeats; ++r) {
    model.ops().synchronize();
    const l3::core::Stopwatch watch;
    model.ops().copy(copy.view(), params);
    model.ops().synchronize();
    best = std::min(best, watch.seconds() / 2);
  }
  return best;
}

// The sizes of a run: the full benchmark's, or the rehearsal's toy ones.
struct Sizes {
  std::int64_t forward_rows = 4;  // the training forward's batch: rows x seq tokens
  std::int64_t forward_seq = 512;
  std::int64_t prompt = 32;  // decode: prompt tokens per sequence
  std::int64_t new_tokens = 33;
  int prefill_batch = 8;
  std::int64_t prefill_prompt = 512;
  int episodes = 8;  // multi-turn: conversations, their turns, each turn's tokens, each message's
  std::int64_t episode_prompt = 256;
  int turns = 4;
  std::int64_t turn_tokens = 32;
  std::int64_t message_tokens = 64;
};

// Seconds for sizes.episodes conversations of sizes.turns policy turns (greedy, no stop, each
// sizes.turn_tokens long) with a message of sizes.message_tokens after each turn but the last:
// from the cache (run_turns), or each turn a new request of the whole conversation so far. Best
// of `repeats` runs after an untimed one.
double episode_seconds(LlamaModel& model, const Sizes& sizes, bool from_cache, int repeats) {
  const int n = sizes.episodes;
  const std::int64_t capacity = sizes.episode_prompt + sizes.turns * sizes.turn_tokens +
                                (sizes.turns - 1) * sizes.message_tokens;
  GenerationEngine engine(model, {.slots = n, .capacity = capacity}, {});
  const std::int32_t vocab = model.config().vocab_size;
  const auto message = [&](std::int64_t episode, int turn) {
    return random_tokens(sizes.message_tokens, vocab,
                         static_cast<std::uint32_t>(1000 + episode * 64 + turn));
  };
  double best = 1e30;
  for (int r = -1; r < repeats; ++r) {
    std::int64_t produced = 0;
    const l3::core::Stopwatch watch;
    if (from_cache) {
      int next = 0;
      std::vector<int> turns(static_cast<std::size_t>(n), 0);
      engine.run_turns(
          [&]() -> std::optional<GenerationRequest> {
            if (next == n) return std::nullopt;
            const auto i = static_cast<std::uint32_t>(next++);
            return GenerationRequest{.record = i,
                                     .prompt = random_tokens(sizes.episode_prompt, vocab, 500 + i),
                                     .max_new = sizes.turn_tokens};
          },
          [&](GenerationOutput&& turn) -> std::optional<GenerationEngine::Continuation> {
            produced += static_cast<std::int64_t>(turn.tokens.size());
            int& done = turns[static_cast<std::size_t>(turn.record)];
            if (++done == sizes.turns) return std::nullopt;
            return GenerationEngine::Continuation{.tokens = message(turn.record, done),
                                                  .max_new = sizes.turn_tokens};
          });
    } else {
      std::vector<std::vector<std::int32_t>> conversations(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) {
        conversations[static_cast<std::size_t>(i)] =
            random_tokens(sizes.episode_prompt, vocab, 500 + static_cast<std::uint32_t>(i));
      }
      for (int t = 0; t < sizes.turns; ++t) {
        int next = 0;
        engine.run(
            [&]() -> std::optional<GenerationRequest> {
              if (next == n) return std::nullopt;
              const int i = next++;
              return GenerationRequest{.record = i,
                                       .prompt = conversations[static_cast<std::size_t>(i)],
                                       .max_new = sizes.turn_tokens};
            },
            [&](GenerationOutput&& out) {
              produced += static_cast<std::int64_t>(out.tokens.size());
              std::vector<std::int32_t>& c = conversations[static_cast<std::size_t>(out.record)];
              c.insert(c.end(), out.tokens.begin(), out.tokens.end());
              if (t + 1 < sizes.turns) {
                const std::vector<std::int32_t> m = message(out.record, t + 1);
                c.insert(c.end(), m.begin(), m.end());
              }
            });
      }
    }
    model.ops().synchronize();
    if (r >= 0) best = std::min(best, watch.seconds());
    if (produced != std::int64_t{n} * sizes.turns * sizes.turn_tokens) {
      throw std::runtime_error(fmt::format("{} tokens generated in episodes, {} expected", produced,
                                           std::int64_t{n} * sizes.turns * sizes.turn_tokens));
    }
  }
  return best;
}

// The training forward pass (no backward) over rows x seq tokens: tokens/s, best of runs.
double forward_tokens_per_second(LlamaModel& model, const Sizes& sizes, int repeats) {
  const std::int64_t rows = sizes.forward_rows;
  const std::int64_t seq = sizes.forward_seq;
  l3::model::BatchBuilder builder(rows, seq, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    builder.add(random_tokens(seq, model.config().vocab_size, 100 + static_cast<std::uint32_t>(r)),
                std::vector<std::uint8_t>(static_cast<std::size_t>(seq), 1));
  }
  const l3::model::Batch batch = builder.finish();
  double best = 1e30;
  for (int r = 0; r <= repeats; ++r) {
    model.load_batch(batch);
    model.ops().synchronize();
    const l3::core::Stopwatch watch;
    model.forward({});
    model.ops().synchronize();
    if (r > 0) best = std::min(best, watch.seconds());  // the first warms up
  }
  return static_cast<double>(rows * seq) / best;
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false;
  bool rehearsal = false;
  std::string json_path;
  std::string model_choice = "mid";
  l3::kernels::Backend backend = l3::kernels::Backend::cpu;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--rehearsal") == 0) {
      rehearsal = true;
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      backend = l3::kernels::parse_backend(argv[++i]);
    } else if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc &&
               (std::strcmp(argv[i + 1], "mid") == 0 ||
                std::strcmp(argv[i + 1], "llama3.2-1b") == 0)) {
      model_choice = argv[++i];
    } else {
      fmt::print(stderr,
                 "usage: {} [--quick] [--rehearsal] [--backend cpu|cuda] "
                 "[--model mid|llama3.2-1b] [--json FILE]\n",
                 argv[0]);
      return 2;
    }
  }
  const bool one_b = model_choice == "llama3.2-1b";
  const int repeats = quick ? 1 : 3;
  const std::unique_ptr<l3::kernels::Ops> ops = l3::kernels::make_ops(backend, 0);
  // The rehearsal runs the tiny model whichever shape is asked for (with that shape's batches).
  const l3::model::ModelConfig config =
      rehearsal ? l3::model::preset("tiny")
                : (one_b ? l3::model::preset("llama3.2-1b") : l3::bench::mid_model());
  const std::string model_name = rehearsal ? "tiny" : model_choice;
  Sizes sizes;
  if (rehearsal) {
    sizes = {.forward_rows = 2,
             .forward_seq = 32,
             .prompt = 4,
             .new_tokens = 3,
             .prefill_batch = 4,
             .prefill_prompt = 32,
             .episodes = 2,
             .episode_prompt = 4,
             .turns = 2,
             .turn_tokens = 3,
             .message_tokens = 2};
  }
  if (quick) sizes.new_tokens = std::min<std::int64_t>(sizes.new_tokens, 9);
  LlamaModel model(config, l3::model::HeadKind::language_model, *ops);
  model.initialize(1);
  const double weight_bytes = static_cast<double>(model.parameters().bytes());
  fmt::print("{} model: {:.1f} M parameters ({:.0f} MB of weights) on {} ({} threads)\n",
             model_name, static_cast<double>(config.parameter_count()) / 1e6, weight_bytes / 1e6,
             ops->name(), omp_get_max_threads());

  const double read = weight_read_seconds(model, quick ? 3 : 10);
  fmt::print("read of the weights: {:.2f} ms ({:.1f} GB/s)\n", read * 1e3,
             weight_bytes / read / 1e9);
  const double forward = forward_tokens_per_second(model, sizes, repeats);
  fmt::print("training forward: {:.0f} tokens/s\n", forward);

  const std::int64_t prompt = sizes.prompt;
  const std::int64_t new_tokens = sizes.new_tokens;
  json decode = json::array();
  // Per decode path: batch 1's ratio to the weights' read time, batch 64's to the forward's.
  std::map<std::string, std::pair<double, double>> ratios;
  using l3::model::DecodePath;
  std::vector<std::pair<std::string, DecodePath>> paths{{"per_pass", DecodePath::per_pass}};
  if (ops->can_capture()) paths.insert(paths.begin(), {"graphs", DecodePath::graphs});
  const std::vector<int> batches = one_b ? std::vector<int>{1, 64} : std::vector<int>{1, 8, 64};
  for (const auto& [path_name, path] : paths) {
    for (const int batch : batches) {
      const double one = generation_seconds(model, batch, prompt, 1, repeats, path);
      const double all = generation_seconds(model, batch, prompt, new_tokens, repeats, path);
      const double per_step = std::max(all - one, 1e-9) / static_cast<double>(new_tokens - 1);
      const double rate = batch / per_step;
      json row = {{"batch", batch},
                  {"decode_path", path_name},
                  {"tokens_per_s", rate},
                  {"ms_per_step", per_step * 1e3}};
      if (batch == 1) {
        const double ratio = read / per_step;
        ratios[path_name].first = ratio;
        row["ratio_to_weight_read"] = ratio;
        fmt::print(
            "decode batch {:>2} ({}): {:8.1f} tokens/s ({:.2f} ms/token) = {:.2f} x the weights' "
            "read bound (goal >= 0.5, aim 0.7)\n",
            batch, path_name, rate, per_step * 1e3, ratio);
      } else {
        const double ratio = rate / forward;
        if (batch == 64) ratios[path_name].second = ratio;
        row["ratio_to_training_forward"] = ratio;
        fmt::print(
            "decode batch {:>2} ({}): {:8.1f} tokens/s ({:.2f} ms/step) = {:.2f} x the training "
            "forward's tokens/s{}\n",
            batch, path_name, rate, per_step * 1e3, ratio, batch == 64 ? " (goal >= 0.5)" : "");
      }
      decode.push_back(row);
    }
  }
  // The default path's figures (graphs where the backend captures).
  const auto& [batch1_ratio, batch64_ratio] = ratios.at(paths.front().first);
  const int prefill_batch = sizes.prefill_batch;
  const std::int64_t prefill_prompt = sizes.prefill_prompt;
  const double prefill_seconds =
      generation_seconds(model, prefill_batch, prefill_prompt, 1, repeats, DecodePath::automatic);
  const double prefill = prefill_batch * prefill_prompt / prefill_seconds;
  fmt::print(
      "prefill: {:.0f} tokens/s ({} prompts of {} tokens) = {:.2f} x the training "
      "forward's tokens/s\n",
      prefill, prefill_batch, prefill_prompt, prefill / forward);
  const double cached = episode_seconds(model, sizes, true, repeats);
  const double again = episode_seconds(model, sizes, false, repeats);
  const double episode_tokens =
      static_cast<double>(sizes.episodes) * static_cast<double>(sizes.turns * sizes.turn_tokens);
  fmt::print(
      "episodes: {} of {} turns of {} tokens after a {}-token prompt, {}-token messages: "
      "{:.0f} tokens/s from the cache = {:.2f} x a generator that prefills each turn's whole "
      "conversation again ({:.0f} tokens/s)\n",
      sizes.episodes, sizes.turns, sizes.turn_tokens, sizes.episode_prompt, sizes.message_tokens,
      episode_tokens / cached, again / cached, episode_tokens / again);

  if (!json_path.empty()) {
    const l3::core::BuildInfo build = l3::core::build_info();
    const json doc = {{"benchmark", "generate"},
                      {"commit", build.git_commit},
                      {"backend", std::string(ops->name())},
                      {"threads", omp_get_max_threads()},
                      {"model", model_name},
                      {"rehearsal", rehearsal},
                      {"parameters", config.parameter_count()},
                      {"weight_read_ms", read * 1e3},
                      {"training_forward_tokens_per_s", forward},
                      {"decode", decode},
                      {"weight_bytes", weight_bytes},
                      {"weight_read_gb_per_s", weight_bytes / read / 1e9},
                      {"decode_paths", json(ratios)},
                      {"batch1_ratio_to_weight_read", batch1_ratio},
                      {"batch64_ratio_to_training_forward", batch64_ratio},
                      {"prefill_tokens_per_s", prefill},
                      {"episodes",
                       {{"conversations", sizes.episodes},
                        {"turns", sizes.turns},
                        {"turn_tokens", sizes.turn_tokens},
                        {"prompt_tokens", sizes.episode_prompt},
                        {"message_tokens", sizes.message_tokens},
                        {"from_cache_tokens_per_s", episode_tokens / cached},
                        {"prefilled_again_tokens_per_s", episode_tokens / again},
                        {"ratio_to_prefilled_again", again / cached}}}};
    std::ofstream(json_path) << doc.dump(2) << '\n';
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
