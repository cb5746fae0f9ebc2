// GRPO's step through the public API (l3::Session), on the mid model (156M parameters) from
// random weights: prompts of about 16 tokens, --num-generations completions of each run to
// --max-completion-length (random weights rarely end a turn), rewarded by the built-in answer
// match. Per step: tokens/s (prompt + completion tokens trained), and how the step divides
// between generating, scoring and training, as the run's own metrics measure them
// (time/generate_ms, time/score_ms, the rest). The baseline is the same step's training
// pass: generation's time against it, for full fine-tuning and for LoRA rank 16. Full
// fine-tuning runs twice: with the completions packed (the default) and padded to rows of
// --seq-len (--pad-completions), the positions one training pass computes and its time compared.
//
// --rehearsal: the tiny preset model, 2 completions of 4 tokens per rank and rows of 64 (the GPU
// check's rehearsal on the CUDA emulation; the same JSON). LoRA adapts the full run's final
// weights (its checkpoint).
// --model llama3.2-1b (or any preset): that shape, random weights, instead of the mid model.
// --async (under mpiexec, 4 ranks; at least 2): asynchronous GRPO instead: the synchronous step on
// every rank against --generation-ranks 1, 2 and 3 with --max-staleness 1 (with the
// importance-sampling correction, and without: no behaviour pass on the generating ranks), on the
// tiny model (or
// --model) with completions of 16 tokens (--length N), for which generation and scoring are about
// half of the synchronous step on the 2-core build machine (4 ranks of one thread):
// steps/s, and each group's idle share (the training ranks waiting for a batch, the generating
// ranks waiting for weights).
//   l3-bench-grpo [--backend cpu|cuda] [--model PRESET] [--quick] [--rehearsal]
//                 [--async [--length N]] [--json FILE]
#include <fmt/format.h>
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/build_info.hpp"
#include "core/log.hpp"
#include "dist/world.hpp"
#include "io/prep/prep_job.hpp"
#include "l3/l3.hpp"
#include "mid_model_inputs.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double metric(const l3::StepMetrics& m, std::string_view name) {
  for (const auto& [key, value] : m.extra)
    if (key == name) return value;
  return 0.0;
}

struct Figures {
  double step_ms = 0, generate_ms = 0, score_ms = 0, train_ms = 0, tokens_per_s = 0;
  double completion_tokens = 0;
  double train_tokens = 0, padding_share = 0;  // positions of one pass over the step's batch
};

// The runs: full fine-tuning with the completions packed (the default) and padded (one row of
// --seq-len each, --pad-completions), LoRA packed.
struct Mode {
  const char* name;
  bool lora;
  bool padded;
};
constexpr std::array<Mode, 3> kModes{
    {{"full", false, false}, {"full_padded", false, true}, {"lora_r16", true, false}}};

// The options both comparisons share: the mid or given model from random weights on the
// prompts, rewarded by the answer match, 8 completions per pass, quiet.
std::vector<std::string> grpo_args(const std::string& dir, const std::string& model,
                                   const std::string& backend, std::int64_t seq_len, int prompts,
                                   int generations, int length, int steps) {
  return {"grpo",
          "--model",
          model,
          "--data",
          dir + "/prompts",
          "--reward-match",
          "answer",
          "--backend",
          backend,
          "--seq-len",
          std::to_string(seq_len),
          "--global-batch",
          std::to_string(prompts),
          "--num-generations",
          std::to_string(generations),
          "--max-completion-length",
          std::to_string(length),
          "--micro-batch",
          "8",
          "--steps",
          std::to_string(steps),
          "--log-every",
          "0",
          "--no-progress",
          "--log-level",
          "warn"};
}

Figures run(const std::string& dir, const std::string& model, const std::string& backend,
            std::int64_t seq_len, const Mode& mode, int steps, int prompts, int generations,
            int length) {
  const bool lora = mode.lora;
  std::vector<std::string> args =
      grpo_args(dir, model, backend, seq_len, prompts, generations, length, steps + 1);
  // LoRA adapts the full run's final weights (a checkpoint: LoRA needs a model to adapt).
  if (lora) {
    args.insert(args.end(), {"--init", dir + "/ckpt", "--lora-rank", "16", "--lora-alpha", "32"});
    args.erase(args.begin() + 1, args.begin() + 3);  // not --model as well
  } else {
    args.insert(args.end(), {"--ckpt-dir", dir + (mode.padded ? "/ckpt-padded" : "/ckpt")});
  }
  if (mode.padded) args.emplace_back("--pad-completions");
  l3::Session session(MPI_COMM_WORLD, l3::RunConfig::from_args(args));
  std::vector<double> step, generate, score, tps, completion, tokens, padding;
  session.on_step([&](const l3::StepMetrics& m) {
    if (m.step == 1) return;  // warm-up
    step.push_back(m.step_ms);
    generate.push_back(metric(m, "time/generate_ms"));
    score.push_back(metric(m, "time/score_ms"));
    tps.push_back(m.tokens_per_s);
    completion.push_back(metric(m, "completions/mean_length"));
    tokens.push_back(metric(m, "train_tokens"));
    padding.push_back(metric(m, "train_padding_share"));
  });
  (void)session.run();
  Figures f;
  f.step_ms = median(step);
  f.generate_ms = median(generate);
  f.score_ms = median(score);
  f.train_ms = f.step_ms - f.generate_ms - f.score_ms;
  f.tokens_per_s = median(tps);
  f.completion_tokens = median(completion) * prompts * generations;
  f.train_tokens = median(tokens);
  f.padding_share = median(padding);
  return f;
}

struct AsyncFigures {
  double step_ms = 0, generate_share = 0, train_idle_share = 0, generate_idle_share = 0;
};

// One configuration of the asynchronous comparison: `generation_ranks` 0 is the synchronous
// run. Medians over the steps after the first two (the first waits for the first batch).
AsyncFigures run_async(const std::string& dir, const std::string& model, const std::string& backend,
                       int generation_ranks, bool correction, int steps, int prompts, int length) {
  std::vector<std::string> args =
      grpo_args(dir, model, backend, 64 + length, prompts, 4, length, steps + 2);
  if (generation_ranks > 0)
    args.insert(args.end(), {"--generation-ranks", std::to_string(generation_ranks)});
  if (!correction) args.emplace_back("--no-importance-sampling-correction");
  l3::Session session(MPI_COMM_WORLD, l3::RunConfig::from_args(args));
  std::vector<double> step, generate, train_idle, generate_idle;
  session.on_step([&](const l3::StepMetrics& m) {
    if (m.step <= 2) return;
    step.push_back(m.step_ms);
    if (generation_ranks == 0) {
      generate.push_back((metric(m, "time/generate_ms") + metric(m, "time/score_ms")) / m.step_ms);
    } else {
      train_idle.push_back(metric(m, "time/generation_wait_ms") / m.step_ms);
      generate_idle.push_back(metric(m, "generation/idle_ms") / m.step_ms);
    }
  });
  (void)session.run();
  return {.step_ms = median(step),
          .generate_share = median(generate),
          .train_idle_share = median(train_idle),
          .generate_idle_share = median(generate_idle)};
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int status = 0;
  try {
    bool quick = false;
    bool rehearsal = false;
    bool async = false;
    int async_length = 0;  // --length: completion tokens of --async (0: 16)
    std::string json_path;
    std::string backend = "cpu";
    std::string preset;  // empty: the mid model
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--quick") == 0) {
        quick = true;
      } else if (std::strcmp(argv[i], "--rehearsal") == 0) {
        rehearsal = true;
      } else if (std::strcmp(argv[i], "--async") == 0) {
        async = true;
      } else if (std::strcmp(argv[i], "--length") == 0 && i + 1 < argc) {
        async_length = std::atoi(argv[++i]);
      } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
        json_path = argv[++i];
      } else if (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
        backend = argv[++i];
      } else if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
        preset = argv[++i];
      } else {
        fmt::print(stderr,
                   "usage: {} [--backend cpu|cuda] [--model PRESET] [--quick] [--rehearsal] "
                   "[--async [--length N]] [--json FILE]\n",
                   argv[0]);
        MPI_Finalize();
        return 2;
      }
    }
    const l3::dist::World world(MPI_COMM_WORLD);
    // The inputs: the mid model's config.json and 64 prompts with answers, prepared with the
    // bytes tokenizer (ids below the model's vocabulary).
    const fs::path dir = fs::temp_directory_path() / fmt::format("l3-bench-grpo-{}", ::getpid());
    if (world.is_root()) {
      fs::create_directories(dir);
      if (preset.empty()) {
        l3::bench::write_mid_model_inputs(dir.string(), 1024);
      } else {
        l3::bench::write_model_inputs(dir.string(), l3::model::preset(preset), 1024);
      }
      std::ofstream prompts(dir / "prompts.jsonl");
      for (int i = 0; i < 64; ++i) {
        prompts << json{{"prompt", fmt::format("What is {} plus {}?", i % 10, i / 10)},
                        {"answer", std::to_string(i % 10 + i / 10)}}
                       .dump()
                << '\n';
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    l3::prep::PrepOptions prep;
    prep.kind = l3::prep::DatasetKind::prompts;
    prep.inputs = {(dir / "prompts.jsonl").string()};
    prep.tokenizer = "bytes";
    prep.output = (dir / "prompts").string();
    const l3::core::Logger quiet(world.rank(), world.size(),
                                 l3::core::LogConfig{.level = l3::core::LogLevel::warn});
    (void)l3::prep::run_prep(world, quiet, prep);

    if (async) {
      // Prompts per step: a multiple of the synchronous ranks, of both splits' training ranks and
      // of their generating ranks (12 on 4 ranks).
      const int ranks = world.size();
      if (ranks < 2) throw std::runtime_error("--async needs at least 2 ranks (mpiexec -n 4)");
      const int prompts = std::lcm(std::lcm(ranks, ranks - 1), std::lcm(std::max(ranks - 2, 1), 2));
      // --quick (the GPU check's rehearsal): shorter completions and fewer steps, each path once.
      const int length = async_length > 0 ? async_length : quick ? 8 : 16;
      const std::string model = preset.empty() ? std::string("tiny") : preset;
      const int steps = quick ? 2 : 16;
      json rows = json::array();
      AsyncFigures synchronous;
      // The synchronous step; each split with the importance-sampling correction (the default:
      // the generating ranks' behaviour pass) and without it (TRL's AsyncGRPOTrainer's ratio).
      struct Config {
        int generation_ranks;
        bool correction;
      };
      for (const Config c : {Config{0, true}, Config{1, true}, Config{2, true}, Config{3, true},
                             Config{1, false}, Config{2, false}}) {
        const int g = c.generation_ranks;
        if (g >= ranks) continue;              // at least one training rank
        if (quick && !c.correction) continue;  // the rehearsal checks that each path runs
        const AsyncFigures f =
            run_async(dir.string(), model, backend, g, c.correction, steps, prompts, length);
        if (g == 0) synchronous = f;
        const double speedup = synchronous.step_ms / std::max(1e-9, f.step_ms);
        if (world.is_root()) {
          if (g == 0) {
            fmt::print(
                "synchronous, {} ranks | {} prompts x 4 completions of up to {} tokens: "
                "step {:.0f} ms ({:.2f} steps/s), generation and scoring {:.0f}% of it\n",
                ranks, prompts, length, f.step_ms, 1e3 / f.step_ms, 100.0 * f.generate_share);
          } else {
            fmt::print(
                "{} generating + {} training ranks, --max-staleness 1{}: step {:.0f} ms "
                "({:.2f} steps/s, {:.2f}x the synchronous rate) | idle: training ranks "
                "{:.0f}%, generating ranks {:.0f}%\n",
                g, ranks - g, c.correction ? "" : ", no correction", f.step_ms, 1e3 / f.step_ms,
                speedup, 100.0 * f.train_idle_share, 100.0 * f.generate_idle_share);
          }
        }
        rows.push_back({{"generation_ranks", g},
                        {"training_ranks", ranks - g},
                        {"max_staleness", g == 0 ? 0 : 1},
                        {"importance_sampling_correction", c.correction},
                        {"step_ms", f.step_ms},
                        {"steps_per_s", 1e3 / std::max(1e-9, f.step_ms)},
                        {"speedup", speedup},
                        {"generate_share", f.generate_share},
                        {"training_idle_share", f.train_idle_share},
                        {"generating_idle_share", f.generate_idle_share}});
      }
      if (world.is_root()) {
        if (!json_path.empty()) {
          const l3::core::BuildInfo build = l3::core::build_info();
          const json doc = {{"benchmark", "grpo_async"},
                            {"backend", backend},
                            {"model", model},
                            {"ranks", ranks},
                            {"threads", omp_get_max_threads()},
                            {"cpus", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))},
                            {"prompts_per_step", prompts},
                            {"num_generations", 4},
                            {"max_completion_length", length},
                            {"commit", build.git_commit},
                            {"runs", rows}};
          std::ofstream(json_path) << doc.dump(2) << '\n';
        }
        std::error_code ec;
        fs::remove_all(dir, ec);
      }
      MPI_Finalize();
      return 0;
    }
    const int steps = quick ? 1 : 3;
    const int prompts = (rehearsal ? 1 : 2) * world.size();
    const int generations = rehearsal ? 2 : 8;
    const int length = rehearsal ? 4 : quick ? 32 : 128;
    const std::int64_t seq_len = rehearsal ? 64 : 256;  // the prompts have about 30 tokens
    const std::string model = rehearsal ? std::string("tiny") : (dir / "config.json").string();
    json results = json::array();
    Figures packed_full;
    for (const Mode& mode : kModes) {
      const Figures f =
          run(dir.string(), model, backend, seq_len, mode, steps, prompts, generations, length);
      const double generated_per_s = f.completion_tokens / std::max(1e-9, f.generate_ms / 1e3);
      if (!mode.lora && !mode.padded) packed_full = f;
      if (world.is_root()) {
        fmt::print(
            "{:11} | {} prompts x {} completions of up to {} tokens: step {:.0f} ms, {:.0f} tok/s "
            "| generate {:.0f} ms ({:.0f}%, {:.0f} new tok/s), score {:.1f} ms, train {:.0f} ms "
            "on {:.0f} positions ({:.0f}% padding) | generate / train = {:.2f}\n",
            mode.name, prompts, generations, length, f.step_ms, f.tokens_per_s, f.generate_ms,
            100.0 * f.generate_ms / f.step_ms, generated_per_s, f.score_ms, f.train_ms,
            f.train_tokens, 100.0 * f.padding_share, f.generate_ms / std::max(1e-9, f.train_ms));
        if (mode.padded) {
          fmt::print(
              "packed against padded (full fine-tuning): {:.2f}x fewer positions trained, train "
              "time {:.2f}x lower, step {:.2f}x faster\n",
              f.train_tokens / std::max(1.0, packed_full.train_tokens),
              f.train_ms / std::max(1e-9, packed_full.train_ms),
              f.step_ms / std::max(1e-9, packed_full.step_ms));
        }
      }
      json row = {{"mode", mode.name},
                  {"step_ms", f.step_ms},
                  {"tokens_per_s", f.tokens_per_s},
                  {"generate_ms", f.generate_ms},
                  {"score_ms", f.score_ms},
                  {"train_ms", f.train_ms},
                  {"train_tokens", f.train_tokens},
                  {"train_padding_share", f.padding_share},
                  {"generate_share", f.generate_ms / f.step_ms},
                  {"generate_over_train", f.generate_ms / std::max(1e-9, f.train_ms)},
                  {"generated_tokens_per_s", generated_per_s}};
      if (mode.padded) {
        row["packed_fewer_tokens"] = f.train_tokens / std::max(1.0, packed_full.train_tokens);
        row["packed_train_speedup"] = f.train_ms / std::max(1e-9, packed_full.train_ms);
        row["packed_step_speedup"] = f.step_ms / std::max(1e-9, packed_full.step_ms);
      }
      results.push_back(std::move(row));
    }
    if (world.is_root()) {
      if (!json_path.empty()) {
        const l3::core::BuildInfo build = l3::core::build_info();
        const json doc = {{"benchmark", "grpo"},
                          {"backend", backend},
                          {"model", rehearsal        ? std::string("tiny")
                                    : preset.empty() ? std::string("mid (156M)")
                                                     : preset},
                          {"ranks", world.size()},
                          {"threads", omp_get_max_threads()},
                          {"prompts_per_step", prompts},
                          {"num_generations", generations},
                          {"max_completion_length", length},
                          {"commit", build.git_commit},
                          {"runs", results}};
        std::ofstream(json_path) << doc.dump(2) << '\n';
      }
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
