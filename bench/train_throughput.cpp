// Training throughput through the public API (l3::Session with an l3::DataSource): tokens/s,
// step time, data wait and MFU of SFT and reward steps, for the issue's shapes on the CUDA
// backend (a Llama-3.2-1B-shaped model at seq 2048, and a Llama-3-8B-shaped model with as many
// layers as fit), or a small CPU case for checking the program itself.
//
// Every row is one document of exactly --seq tokens, every token in the loss (reward: pairs of
// two such sequences), so the work is what the PaLM formula counts (6N + 12 L H T per token,
// N without the input embedding, the lm_head or the score head as the phase has) and what the
// Hugging Face baseline (bench/baselines/hf_train.py) runs. MFU is given against the peak
// passed with --peak-tflops (the bf16 GEMM rate l3-bench-gpu measured in the same session) and
// against the datasheet dense bf16 peak of the GPU (989 TFLOP/s for H100/H200).
//
//   l3-bench-train-throughput [--backend cuda|cpu] [--case NAME ...] [--steps N] [--warmup N]
//                             [--attention auto|cudnn|cudnn-nondeterministic|fallback]
//                             [--micro-batch N]
//                  [--peak-tflops T] [--datasheet-tflops T] [--json FILE]
//   cases: 1b-sft, 1b-reward, 8b-sft, 8b-reward (cuda default: all four), tiny-sft,
//   tiny-reward (cpu default)
// Without --attention the runs take the program's default (rows marked "default_options": true,
// what a user gets); with it, that attention.
// --micro-batch N: that many rows (pairs) per step instead of the largest that the memory plan
// fits (recomputation then only if N rows do not fit without it).
#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <l3/l3.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/build_info.hpp"
#include "kernels/backend_options.hpp"
#include "kernels/backends.hpp"
#include "model/model_config.hpp"

#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Case {
  std::string name;
  std::string preset;
  int layers = 0;  // 0: the preset's; -1: as many as fit
  std::string phase;
  std::int64_t seq = 2048;
};

// Random token ids, a fresh set per step (the same for a given step and rank).
class RandomDocuments final : public l3::DataSource {
 public:
  RandomDocuments(std::int64_t vocab, std::int64_t seq, int rows, bool pairs)
      : vocab_(vocab), seq_(seq), rows_(rows), pairs_(pairs) {}

  void fill(std::int64_t step, int rank, int /*ranks*/, l3::StepSamples& out) override {
    std::mt19937_64 random(static_cast<std::uint64_t>(step) * 1000003U +
                           static_cast<std::uint64_t>(rank));
    std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab_ - 1));
    auto sequence = [&] {
      std::vector<std::int32_t> s(static_cast<std::size_t>(seq_));
      for (auto& t : s) t = token(random);
      return s;
    };
    for (int r = 0; r < rows_; ++r) {
      if (pairs_) {  // two halves: a pair fills one row
        std::vector<std::int32_t> both = sequence();
        const auto half = both.begin() + seq_ / 2;
        out.pairs.push_back({.chosen = std::vector<std::int32_t>(both.begin(), half),
                             .rejected = std::vector<std::int32_t>(half, both.end()),
                             .margin = 0});
      } else {
        l3::SftDocument d;
        d.tokens = sequence();
        d.loss_mask.assign(d.tokens.size(), 1);
        out.documents.push_back(std::move(d));
      }
    }
  }

 private:
  std::int64_t vocab_;
  std::int64_t seq_;
  int rows_;
  bool pairs_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::int64_t device_memory_bytes(const std::string& backend) {
#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
  if (backend == "cuda") {
    std::size_t free = 0;
    std::size_t total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) return static_cast<std::int64_t>(free);
  }
#endif
  (void)backend;
  return std::int64_t{16} << 30;  // the CPU cases are small
}

std::string gpu_name(const std::string& backend) {
#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
  cudaDeviceProp p{};
  if (backend == "cuda" && cudaGetDeviceProperties(&p, 0) == cudaSuccess) return p.name;
#endif
  (void)backend;
  return "cpu";
}

// A config.json of the preset with `layers` decoder blocks, in `dir`.
std::string model_file(const Case& c, int layers, const fs::path& dir) {
  l3::model::ModelConfig m = l3::model::preset(c.preset);
  if (layers > 0) m.n_layers = layers;
  const fs::path path = dir / fmt::format("{}-{}layers.json", c.preset, m.n_layers);
  std::ofstream(path) << m.to_hf_json().dump(2);
  return path.string();
}

// --attention, for every case of this run; empty: the program's default (none passed).
std::string& attention_choice() {
  static std::string choice;
  return choice;
}

std::vector<std::string> run_args(const std::string& phase, const Case& c, const std::string& model,
                                  std::int64_t rows, int steps, const std::string& backend,
                                  bool recompute) {
  std::vector<std::string> args = {phase,
                                   "--model",
                                   model,
                                   "--seq-len",
                                   std::to_string(c.seq),
                                   "--global-batch",
                                   std::to_string(rows),
                                   "--micro-batch",
                                   std::to_string(rows),
                                   "--steps",
                                   std::to_string(steps),
                                   "--backend",
                                   backend,
                                   "--lr",
                                   "1e-5",
                                   "--log-level",
                                   "warn",
                                   "--no-progress"};
  if (recompute) args.emplace_back("--recompute");
  if (backend == "cuda" && !attention_choice().empty()) {
    args.emplace_back("--attention");
    args.push_back(attention_choice());
  }
  return args;
}

struct Choice {
  int layers = 0;
  std::int64_t rows = 0;
  bool recompute = false;
  std::int64_t planned_bytes = 0;
};

// The largest micro-batch (rows, or pairs of half rows, up to 16) that the memory plan fits
// into 85% of the free device memory; without recomputation if possible. For layers == -1,
// also the most decoder blocks that fit with one row (then the micro-batch for them). Planned
// as SFT rows for both phases (a pair here fills one row; SFT's loss scratch is the larger).
Choice choose(const Case& c, const std::string& backend, std::int64_t fixed_rows,
              const fs::path& dir) {
  const auto budget =
      static_cast<std::int64_t>(0.85 * static_cast<double>(device_memory_bytes(backend)));
  auto planned = [&](int layers, std::int64_t rows, bool recompute) {
    const std::string model = model_file(c, layers, dir);
    const l3::RunConfig config =
        l3::RunConfig::from_args(run_args("sft", c, model, rows, 1, backend, recompute));
    return l3::plan_memory(config, 1).total_bytes;
  };
  Choice best;
  int layers = c.layers == 0 ? l3::model::preset(c.preset).n_layers : c.layers;
  if (layers < 0) {
    const int preset_layers = l3::model::preset(c.preset).n_layers;
    layers = 1;
    for (int l = preset_layers; l >= 1; --l) {
      if (planned(l, 1, true) <= budget) {
        layers = l;
        break;
      }
    }
  }
  best.layers = layers;
  if (fixed_rows > 0) {
    const std::int64_t bytes = planned(layers, fixed_rows, false);
    if (bytes <= budget) return {layers, fixed_rows, false, bytes};
    return {layers, fixed_rows, true, planned(layers, fixed_rows, true)};
  }
  for (const bool recompute : {false, true}) {
    for (std::int64_t rows = 16; rows >= 1; rows /= 2) {
      const std::int64_t bytes = planned(layers, rows, recompute);
      if (bytes <= budget) {
        if (rows > best.rows) best = {layers, rows, recompute, bytes};
        break;
      }
    }
    if (best.rows >= 4) break;  // recomputation only when it buys a real batch
  }
  if (best.rows == 0) best = {layers, 1, true, planned(layers, 1, true)};
  return best;
}

json run_case(const Case& c, const std::string& backend, int steps, int warmup,
              std::int64_t fixed_rows, double peak, double datasheet, const fs::path& dir) {
  const Choice choice = choose(c, backend, fixed_rows, dir);
  const std::string model = model_file(c, choice.layers, dir);
  const bool reward = c.phase == "reward";
  // Reward: the micro-batch counts pairs, each of two sequences of seq / 2 tokens.
  const l3::RunConfig config = l3::RunConfig::from_args(
      run_args(c.phase, c, model, choice.rows, steps + warmup, backend, choice.recompute));
  const l3::model::ModelConfig m = l3::model::preset(c.preset);
  l3::Session session(MPI_COMM_WORLD, config,
                      std::make_shared<RandomDocuments>(m.vocab_size, c.seq,
                                                        static_cast<int>(choice.rows), reward));
  std::vector<double> step_ms;
  std::vector<double> wait_ms;
  std::vector<double> tokens_per_s;
  double loss = 0;
  session.on_step([&](const l3::StepMetrics& s) {
    loss = s.loss;
    if (s.step <= warmup) return;
    step_ms.push_back(s.step_ms);
    wait_ms.push_back(s.data_wait_ms);
    tokens_per_s.push_back(s.tokens_per_s);
  });
  const l3::RunSummary summary = session.run();
  l3::model::ModelConfig shaped = m;
  shaped.n_layers = choice.layers;
  // Attention spans a document: seq tokens, or seq / 2 for a pair's sequences.
  const double flops_per_token =
      shaped.training_flops_per_token(reward ? c.seq / 2 : c.seq, !reward);
  const double tps = median(tokens_per_s);
  const double achieved = tps * flops_per_token / 1e12;
  json row = {
      {"impl", "llama3-hpc"},
      {"model", choice.layers == m.n_layers ? c.preset
                                            : fmt::format("{}-{}layers", c.preset, choice.layers)},
      {"phase", c.phase},
      {"seq", c.seq},
      {"micro_batch", choice.rows},
      {"recompute", choice.recompute},
      {"attention", backend != "cuda"            ? std::string("cpu")
                    : attention_choice().empty() ? std::string("default")
                                                 : attention_choice()},
      {"default_options", attention_choice().empty()},
      {"planned_gib", static_cast<double>(choice.planned_bytes) / (1 << 30)},
      {"steps_timed", step_ms.size()},
      {"tokens_per_s", tps},
      {"step_ms", median(step_ms)},
      {"data_wait_ms", median(wait_ms)},
      {"achieved_tflops", achieved},
      {"last_loss", loss}};
  if (peak > 0) {
    row["mfu"] = achieved / peak;
    row["peak_tflops"] = peak;
  }
  if (datasheet > 0) {
    row["mfu_datasheet"] = achieved / datasheet;
    row["datasheet_tflops"] = datasheet;
  }
  // Which attention really ran: cuDNN may decline a shape, and then the fallback's figures
  // stand under the "cudnn" row.
  static const std::regex counts(
      R"(attention: (\d+) calls on cuDNN, (\d+) on the fallback(?: \(cuDNN declined: (.*)\))?)");
  if (std::smatch found; std::regex_search(summary.backend_report, found, counts)) {
    row["cudnn_calls"] = std::stoll(found[1].str());
    row["fallback_calls"] = std::stoll(found[2].str());
    if (found[3].matched) row["cudnn_declined"] = found[3].str();
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 0;
  try {
    std::string backend = l3::kernels::visible_cuda_devices() > 0 ? "cuda" : "cpu";
    std::vector<std::string> names;
    int steps = 10;
    int warmup = 3;
    std::int64_t fixed_rows = 0;  // 0: the largest that fits
    double peak = 0;
    double datasheet = -1;
    std::string json_path;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
      if (a == "--backend")
        backend = next();
      else if (a == "--case")
        names.push_back(next());
      else if (a == "--steps")
        steps = std::stoi(next());
      else if (a == "--warmup")
        warmup = std::stoi(next());
      else if (a == "--peak-tflops")
        peak = std::stod(next());
      else if (a == "--datasheet-tflops")
        datasheet = std::stod(next());
      else if (a == "--json")
        json_path = next();
      else if (a == "--attention")
        attention_choice() = next();
      else if (a == "--micro-batch")
        fixed_rows = std::stoll(next());
      else {
        std::fprintf(stderr, "l3-bench-train-throughput: unknown argument %s\n", a.c_str());
        MPI_Finalize();
        return 2;
      }
    }
    if (fixed_rows < 0) throw std::invalid_argument("--micro-batch: expected a positive number");
    if (datasheet < 0)
      datasheet = l3::kernels::default_peak_tflops(l3::kernels::parse_backend(backend), 0);
    const std::vector<Case> all = {
        {"1b-sft", "llama3.2-1b", 0, "sft", 2048}, {"1b-reward", "llama3.2-1b", 0, "reward", 2048},
        {"8b-sft", "llama3-8b", -1, "sft", 2048},  {"8b-reward", "llama3-8b", -1, "reward", 2048},
        {"tiny-sft", "tiny", 0, "sft", 256},       {"tiny-reward", "tiny", 0, "reward", 256}};
    if (names.empty()) {
      names = backend == "cuda"
                  ? std::vector<std::string>{"1b-sft", "1b-reward", "8b-sft", "8b-reward"}
                  : std::vector<std::string>{"tiny-sft", "tiny-reward"};
    }
    const fs::path dir = fs::temp_directory_path() / fmt::format("l3-bench-train-{}", ::getpid());
    fs::create_directories(dir);
    json rows = json::array();
    for (const std::string& name : names) {
      const auto c =
          std::find_if(all.begin(), all.end(), [&](const Case& k) { return k.name == name; });
      if (c == all.end()) {
        std::fprintf(stderr, "l3-bench-train-throughput: unknown case %s\n", name.c_str());
        rc = 2;
        continue;
      }
      if (backend != "cuda" && c->preset != "tiny") {  // hours of CPU time for nothing useful
        std::fprintf(stderr,
                     "l3-bench-train-throughput: case %s needs the CUDA backend (on the CPU: "
                     "tiny-sft, tiny-reward)\n",
                     name.c_str());
        rc = 2;
        continue;
      }
      try {
        json row = run_case(*c, backend, steps, warmup, fixed_rows, peak, datasheet, dir);
        std::string mfu;
        if (row.contains("mfu"))
          mfu += fmt::format(", MFU {:.1f}% of measured", 100 * row["mfu"].get<double>());
        if (row.contains("mfu_datasheet"))
          mfu += fmt::format(", {:.1f}% of datasheet", 100 * row["mfu_datasheet"].get<double>());
        fmt::print(
            "{:<12} {:<26} seq {} x {}{}: {:.0f} tokens/s, step {:.1f} ms, data wait {:.2f} ms, "
            "{:.1f} TFLOP/s{}\n",
            name, row["model"].get<std::string>(), c->seq, row["micro_batch"].get<long long>(),
            row["recompute"].get<bool>() ? " (recompute)" : "", row["tokens_per_s"].get<double>(),
            row["step_ms"].get<double>(), row["data_wait_ms"].get<double>(),
            row["achieved_tflops"].get<double>(), mfu);
        std::fflush(stdout);
        rows.push_back(std::move(row));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "l3-bench-train-throughput: %s failed: %s\n", name.c_str(), e.what());
        rows.push_back({{"impl", "llama3-hpc"}, {"case", name}, {"error", e.what()}});
        rc = 1;
      }
    }
    fs::remove_all(dir);
    if (!json_path.empty()) {
      const l3::core::BuildInfo build = l3::core::build_info();
      json doc = {{"gpu", gpu_name(backend)},
                  {"backend", backend},
                  {"commit", build.git_commit},
                  {"training", rows}};
      std::ofstream(json_path) << doc.dump(2) << '\n';
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "l3-bench-train-throughput: %s\n", e.what());
    rc = 2;
  }
  MPI_Finalize();
  return rc;
}
