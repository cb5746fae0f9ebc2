// LoRA against full fine-tuning, in one run on the same model and batch: the step time
// (forward + backward + AdamW) and the memory the step needs (bytes the backend allocated:
// weights, gradients, AdamW moments, activations), full fine-tuning being the baseline. LoRA
// rank 16 on every projection (PEFT's usual all-linear setting) and rank 8 on q and v (the
// original paper's). On the CPU backend a small shape and the benchmarks' mid model (156M); on
// the CUDA backend (the one-shot GPU check) the mid model and Llama 3.2 1B at 2 x 2048 tokens.
//
//   l3-bench-lora [--backend cpu|cuda] [--quick] [--rehearsal] [--json FILE]
// --quick: one timed step; --rehearsal: a toy shape only (the GPU check's rehearsal on the
// CUDA emulation).
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/build_info.hpp"
#include "core/rng.hpp"
#include "core/timer.hpp"
#include "kernels/backend_options.hpp"
#include "kernels/backends.hpp"
#include "mid_model_inputs.hpp"
#include "model/llama_model.hpp"
#include "train/adamw_optimizer.hpp"
#include "train/objectives/language_model_loss.hpp"

namespace {

using l3::model::LoraConfig;
using l3::model::ModelConfig;
using nlohmann::json;

struct Shape {
  std::string name;
  ModelConfig config;
  std::int64_t rows;
  std::int64_t seq_len;
};

l3::model::Batch random_batch(const Shape& s) {
  const l3::core::CounterRng rng(3, l3::core::RngPurpose::test);
  l3::model::BatchBuilder builder(s.rows, s.seq_len, 0);
  std::uint64_t draw = 0;
  for (std::int64_t r = 0; r < s.rows; ++r) {
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(s.seq_len));
    for (auto& t : tokens) {
      t = static_cast<std::int32_t>(
          rng.below(draw++, static_cast<std::uint64_t>(s.config.vocab_size)));
    }
    builder.add(tokens, std::vector<std::uint8_t>(tokens.size(), 1));
  }
  return builder.finish();
}

struct Result {
  double step_ms = 0;
  double fwd_bwd_ms = 0;
  double adamw_ms = 0;
  std::int64_t bytes = 0;  // allocated for the step: model, gradients, moments, activations
  std::int64_t trained = 0;
};

Result run(const Shape& s, std::optional<LoraConfig> lora, int steps,
           l3::kernels::Backend backend) {
  const std::unique_ptr<l3::kernels::Ops> backend_ops = l3::kernels::make_ops(backend, 0);
  l3::kernels::Ops& ops = *backend_ops;
  l3::model::ModelOptions options;
  if (lora) options.lora = *lora;
  l3::model::LlamaModel model(s.config, l3::model::HeadKind::language_model, ops, options);
  model.initialize(1);
  l3::train::AdamW optimizer(ops, model.trainable_layout(), {});
  const l3::model::Batch batch = random_batch(s);
  const auto count = static_cast<float>(std::max<std::int64_t>(1, batch.counted_tokens()));
  std::vector<double> fwd_bwd;
  std::vector<double> adamw;
  for (int step = 0; step <= steps; ++step) {  // step 0 warms up (allocations, page faults)
    model.set_dropout_draw({.seed = 1, .step = static_cast<std::uint64_t>(step)});
    model.zero_gradients();
    const l3::core::Stopwatch watch;
    (void)l3::train::LanguageModelLoss(model).forward_backward(batch, 1.0F / count);
    ops.synchronize();
    const double fb = watch.seconds();
    const l3::core::Stopwatch opt_watch;
    optimizer.step(model.master_weights(), model.weight_copy(), model.gradients(), 1e-4F, 1.0F);
    ops.synchronize();
    if (step > 0) {
      fwd_bwd.push_back(fb);
      adamw.push_back(opt_watch.seconds());
    }
  }
  std::sort(fwd_bwd.begin(), fwd_bwd.end());
  std::sort(adamw.begin(), adamw.end());
  Result r;
  r.fwd_bwd_ms = fwd_bwd[fwd_bwd.size() / 2] * 1e3;
  r.adamw_ms = adamw[adamw.size() / 2] * 1e3;
  r.step_ms = r.fwd_bwd_ms + r.adamw_ms;
  r.bytes = ops.allocated_bytes();
  r.trained = model.trainable_layout().parameter_count();
  return r;
}

LoraConfig lora_of(int rank, std::string_view targets) {
  LoraConfig lora;
  lora.rank = rank;
  lora.alpha = 2.0 * rank;
  lora.targets = l3::model::parse_lora_targets(targets);
  return lora;
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false;
  bool rehearsal = false;
  std::string json_path;
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
    } else {
      fmt::print(stderr, "usage: {} [--backend cpu|cuda] [--quick] [--rehearsal] [--json FILE]\n",
                 argv[0]);
      return 2;
    }
  }
  ModelConfig small = l3::bench::mid_model();
  small.name = "small";
  small.vocab_size = 8192;
  small.hidden_size = 256;
  small.intermediate_size = 768;
  small.n_layers = 4;
  small.n_heads = 4;
  small.n_kv_heads = 2;
  small.head_dim = 64;
  ModelConfig toy = small;
  toy.name = "toy";
  toy.vocab_size = 512;
  toy.hidden_size = 64;
  toy.intermediate_size = 192;
  toy.n_layers = 2;
  toy.head_dim = 16;
  const bool cuda = backend == l3::kernels::Backend::cuda;
  std::vector<Shape> shapes;
  if (rehearsal) {
    shapes = {{"toy", toy, 1, 64}};
  } else if (cuda) {
    shapes = {{"mid", l3::bench::mid_model(), 2, 512},
              {"llama3.2-1b", l3::model::preset("llama3.2-1b"), 2, 2048}};
  } else {
    shapes = {{"small", small, 8, 256}, {"mid", l3::bench::mid_model(), 2, 512}};
  }
  const std::vector<std::pair<std::string, LoraConfig>> variants = {
      {"r16 all", lora_of(16, "q,k,v,o,gate,up,down")}, {"r8 q,v", lora_of(8, "q,v")}};
  const int steps = quick ? 1 : 3;
  fmt::print("{} backend ({} OpenMP threads); step = forward + backward + AdamW, median of {}\n",
             l3::kernels::backend_name(backend), omp_get_max_threads(), steps);
  json results = json::array();
  for (const Shape& s : shapes) {
    const Result full = run(s, std::nullopt, steps, backend);
    fmt::print(
        "{:<6} {:>6.1f}M params | full fine-tuning: {:8.1f} ms/step ({:.1f} + {:.1f}), "
        "{:7.1f} MB\n",
        s.name, static_cast<double>(full.trained) / 1e6, full.step_ms, full.fwd_bwd_ms,
        full.adamw_ms, static_cast<double>(full.bytes) / 1e6);
    json row = {{"model", s.name},
                {"parameters", full.trained},
                {"seq_len", s.seq_len},
                {"rows", s.rows},
                {"full", {{"step_ms", full.step_ms}, {"bytes", full.bytes}}}};
    for (const auto& [name, lora] : variants) {
      const Result r = run(s, lora, steps, backend);
      fmt::print(
          "       LoRA {:<8} {:>9} trained | {:8.1f} ms/step ({:.1f} + {:.1f}) = {:.2f} x "
          "full, {:7.1f} MB = {:.2f} x full\n",
          name, r.trained, r.step_ms, r.fwd_bwd_ms, r.adamw_ms, r.step_ms / full.step_ms,
          static_cast<double>(r.bytes) / 1e6,
          static_cast<double>(r.bytes) / static_cast<double>(full.bytes));
      row["lora"][name] = {
          {"rank", lora.rank},
          {"targets", lora.targets_text()},
          {"trained", r.trained},
          {"step_ms", r.step_ms},
          {"fwd_bwd_ms", r.fwd_bwd_ms},
          {"adamw_ms", r.adamw_ms},
          {"bytes", r.bytes},
          {"time_ratio", r.step_ms / full.step_ms},
          {"memory_ratio", static_cast<double>(r.bytes) / static_cast<double>(full.bytes)}};
    }
    results.push_back(row);
  }
  if (!json_path.empty()) {
    const l3::core::BuildInfo build = l3::core::build_info();
    const json doc = {{"benchmark", "lora"},
                      {"backend", l3::kernels::backend_name(backend)},
                      {"commit", build.git_commit},
                      {"threads", omp_get_max_threads()},
                      {"models", results}};
    std::ofstream(json_path) << doc.dump(2) << '\n';
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
