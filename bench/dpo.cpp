// DPO against SFT, in one run on the same model and the same tokens: the forward + backward
// time of a micro-batch of preference pairs (both sequences packed, the responses counted),
// SFT on exactly those rows and masks being the baseline. Full fine-tuning (the reference's
// log-probabilities given: precomputed) and LoRA rank 16 on every projection (the base model
// without adapters as the reference: one more forward pass), each against SFT of the same kind;
// and the precompute pass's cost per micro-batch (a forward pass and the sequences'
// log-probabilities) against the SFT step.
//
//   l3-bench-dpo [--backend cpu|cuda] [--quick] [--json FILE]
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
#include "train/objectives/dpo_loss.hpp"
#include "train/objectives/language_model_loss.hpp"

namespace {

using l3::model::LoraConfig;
using l3::model::ModelConfig;
using nlohmann::json;

struct Shape {
  std::string name;
  ModelConfig config;
  std::int64_t pairs;    // one pair per row
  std::int64_t seq_len;  // each sequence half a row: a quarter prompt, the rest response
};

l3::model::Batch pair_batch(const Shape& s) {
  const l3::core::CounterRng rng(5, l3::core::RngPurpose::test);
  l3::model::BatchBuilder builder(s.pairs, s.seq_len, 0);
  std::uint64_t draw = 0;
  const auto length = static_cast<std::size_t>(s.seq_len / 2);
  auto sequence = [&] {
    std::vector<std::int32_t> tokens(length);
    for (auto& t : tokens)
      t = static_cast<std::int32_t>(
          rng.below(draw++, static_cast<std::uint64_t>(s.config.vocab_size)));
    return tokens;
  };
  std::vector<std::uint8_t> mask(length, 1);
  std::fill_n(mask.begin(), length / 4, 0);
  for (std::int64_t p = 0; p < s.pairs; ++p)
    builder.add_pair(sequence(), sequence(), 0.0F, p, mask, mask);
  return builder.finish();
}

enum class Pass { sft, dpo, reference };

// Median milliseconds of one pass over the batch.
double time_pass(const Shape& s, std::optional<LoraConfig> lora, Pass pass, int steps,
                 l3::kernels::Backend backend) {
  const std::unique_ptr<l3::kernels::Ops> backend_ops = l3::kernels::make_ops(backend, 0);
  l3::kernels::Ops& ops = *backend_ops;
  l3::model::ModelOptions options;
  if (lora) options.lora = *lora;
  l3::model::LlamaModel model(s.config, l3::model::HeadKind::language_model, ops, options);
  model.initialize(1);
  const l3::model::Batch batch = pair_batch(s);
  const auto count = static_cast<float>(std::max<std::int64_t>(1, batch.counted_tokens()));
  // Full fine-tuning's reference: precomputed (here: the model's own, as at step 0).
  const std::vector<double> reference =
      lora ? std::vector<double>{} : l3::train::sequence_log_probs(model, batch, false);
  l3::train::LanguageModelLoss sft(model);
  l3::train::DpoLoss dpo(model, {}, nullptr);
  std::vector<double> times;
  for (int step = 0; step <= steps; ++step) {  // step 0 warms up
    model.zero_gradients();
    sft.begin_step();
    const l3::core::Stopwatch watch;
    switch (pass) {
      case Pass::sft:
        sft.train(batch, 1.0F / count);
        break;
      case Pass::dpo:
        (void)dpo.forward_backward(batch, 1.0F / static_cast<float>(s.pairs), reference);
        break;
      case Pass::reference:
        (void)l3::train::sequence_log_probs(model, batch, false, /*adapters=*/false);
        break;
    }
    ops.synchronize();
    if (step > 0) times.push_back(watch.seconds() * 1e3);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false;
  std::string json_path;
  l3::kernels::Backend backend = l3::kernels::Backend::cpu;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      backend = l3::kernels::parse_backend(argv[++i]);
    } else {
      fmt::print(stderr, "usage: {} [--backend cpu|cuda] [--quick] [--json FILE]\n", argv[0]);
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
  const bool cuda = backend == l3::kernels::Backend::cuda;
  std::vector<Shape> shapes;
  if (cuda) {
    shapes.push_back({"mid", l3::bench::mid_model(), 4, 1024});
    shapes.push_back({"llama3.2-1b", l3::model::preset("llama3.2-1b"), 2, 2048});
  } else {
    shapes.push_back({"small", small, 8, 256});
    shapes.push_back({"mid", l3::bench::mid_model(), 2, 512});
  }
  LoraConfig lora;
  lora.rank = 16;
  lora.alpha = 32;
  lora.targets = l3::model::parse_lora_targets("q,k,v,o,gate,up,down");
  const int steps = quick ? 1 : 3;
  fmt::print(
      "{} backend ({} OpenMP threads); forward + backward of one micro-batch of pairs, "
      "median of {}\n",
      l3::kernels::backend_name(backend), omp_get_max_threads(), steps);
  json results = json::array();
  for (const Shape& s : shapes) {
    const double sft = time_pass(s, std::nullopt, Pass::sft, steps, backend);
    const double dpo = time_pass(s, std::nullopt, Pass::dpo, steps, backend);
    const double reference = time_pass(s, std::nullopt, Pass::reference, steps, backend);
    const double sft_lora = time_pass(s, lora, Pass::sft, steps, backend);
    const double dpo_lora = time_pass(s, lora, Pass::dpo, steps, backend);
    fmt::print(
        "{:<12} {} pairs x {} tokens | full: SFT {:.1f} ms, DPO {:.1f} ms = {:.2f} x SFT; "
        "precompute {:.1f} ms = {:.2f} x SFT | LoRA r16: SFT {:.1f} ms, DPO {:.1f} ms = "
        "{:.2f} x SFT\n",
        s.name, s.pairs, s.seq_len, sft, dpo, dpo / sft, reference, reference / sft, sft_lora,
        dpo_lora, dpo_lora / sft_lora);
    results.push_back(
        {{"model", s.name},
         {"pairs", s.pairs},
         {"seq_len", s.seq_len},
         {"full", {{"sft_ms", sft}, {"dpo_ms", dpo}, {"ratio", dpo / sft}}},
         {"precompute", {{"ms", reference}, {"ratio_to_sft", reference / sft}}},
         {"lora_r16",
          {{"sft_ms", sft_lora}, {"dpo_ms", dpo_lora}, {"ratio", dpo_lora / sft_lora}}}});
  }
  if (!json_path.empty()) {
    const l3::core::BuildInfo build = l3::core::build_info();
    const json doc = {{"benchmark", "dpo"},
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
