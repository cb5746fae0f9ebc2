// CPU model benchmark: forward+backward tokens/s and achieved GFLOP/s (PaLM formula
// 6N + 12 L H Q T) of a small and a mid-size Llama on the CPU backend, next to the OpenBLAS
// SGEMM rate measured in the same run. The ratio model/SGEMM is the figure of merit.
//
//   l3-bench-cpu-model [--quick] [--profile] [--json FILE]
// --profile times every backend op (with a synchronisation around each) and prints the split.
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/build_info.hpp"
#include "core/rng.hpp"
#include "core/timer.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/profiling_ops.hpp"
#include "model/llama_model.hpp"
#include "train/adamw_optimizer.hpp"
#include "train/objectives/language_model_loss.hpp"

namespace {

using l3::model::ModelConfig;
using nlohmann::json;

// The best of several runs of an (n x n) . (n x n)^T SGEMM, in GFLOP/s.
double sgemm_gflops(int n, int repeats) {
  std::vector<float> a(static_cast<std::size_t>(n) * n);
  std::vector<float> b(a.size());
  std::vector<float> c(a.size());
  l3::core::fill_normal(a, 0.0F, 1.0F, l3::core::CounterRng(1, l3::core::RngPurpose::test));
  l3::core::fill_normal(b, 0.0F, 1.0F, l3::core::CounterRng(2, l3::core::RngPurpose::test));
  double best = 0;
  for (int r = 0; r < repeats + 1; ++r) {
    const l3::core::Stopwatch watch;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0F, a.data(), n, b.data(), n,
                0.0F, c.data(), n);
    const double s = watch.seconds();
    if (r > 0) best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s / 1e9);
  }
  return best;
}

struct Shape {
  std::string name;
  ModelConfig config;
  std::int64_t rows;
  std::int64_t seq_len;
};

ModelConfig make_config(const std::string& name, std::int64_t vocab, std::int64_t hidden,
                        std::int64_t intermediate, int layers, int heads, int kv_heads) {
  ModelConfig c = l3::model::preset("tiny");
  c.name = name;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = static_cast<int>(hidden / heads);
  c.max_position_embeddings = 8192;
  return c;
}

// One document of seq_len tokens per row, every token counted: the work the PaLM formula
// assumes (packing shorter documents would make attention cheaper than the formula credits).
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

json run(const Shape& s, int steps, double sgemm, bool profile) {
  l3::kernels::CpuOps cpu;
  l3::kernels::ProfilingOps profiled(cpu);
  l3::kernels::Ops& ops = profile ? static_cast<l3::kernels::Ops&>(profiled) : cpu;
  l3::model::LlamaModel model(s.config, l3::model::HeadKind::language_model, ops);
  model.initialize(1);
  l3::train::AdamW optimizer(ops, model.layout(), {});
  const l3::model::Batch batch = random_batch(s);
  const auto count = static_cast<float>(std::max<std::int64_t>(1, batch.counted_tokens()));
  const auto tokens = static_cast<double>(batch.tokens_count());

  std::vector<double> fwd_bwd;
  std::vector<double> opt;
  for (int step = 0; step <= steps; ++step) {  // step 0 warms up (allocations, page faults)
    if (step == 1) profiled.clear();
    model.zero_gradients();
    const l3::core::Stopwatch watch;
    (void)l3::train::LanguageModelLoss(model).forward_backward(batch, 1.0F / count);
    const double fb = watch.seconds();
    const l3::core::Stopwatch opt_watch;
    optimizer.step(model.master_weights(), model.weight_copy(), model.gradients(), 1e-4F, 1.0F);
    if (step > 0) {
      fwd_bwd.push_back(fb);
      opt.push_back(opt_watch.seconds());
    }
  }
  std::sort(fwd_bwd.begin(), fwd_bwd.end());
  const double median = fwd_bwd[fwd_bwd.size() / 2];
  const double flops = s.config.training_flops_per_token(s.seq_len) * tokens;
  const double gflops = flops / median / 1e9;
  const double opt_ms = opt[opt.size() / 2] * 1e3;
  fmt::print(
      "{:<6} {:>6.1f}M params  L={:<2} H={:<5} I={:<5} V={:<6} T={:<4} B={:<2} | "
      "fwd+bwd {:8.1f} ms  {:8.0f} tok/s  {:6.1f} GFLOP/s  = {:.2f} x SGEMM | adamw {:.1f} ms\n",
      s.name, static_cast<double>(s.config.parameter_count()) / 1e6, s.config.n_layers,
      s.config.hidden_size, s.config.intermediate_size, s.config.vocab_size, s.seq_len, s.rows,
      median * 1e3, tokens / median, gflops, gflops / sgemm, opt_ms);
  if (profile) {
    std::vector<std::pair<double, std::string>> by_time;
    for (const auto& [op, t] : profiled.times())
      by_time.emplace_back(t.total_seconds() / steps, op);
    std::sort(by_time.rbegin(), by_time.rend());
    for (const auto& [seconds, op] : by_time) {
      fmt::print("    {:<24} {:9.1f} ms/step  {:5.1f}%\n", op, seconds * 1e3,
                 100 * seconds / (median + opt[0]));
    }
  }
  return {{"model", s.name},
          {"parameters", s.config.parameter_count()},
          {"layers", s.config.n_layers},
          {"hidden", s.config.hidden_size},
          {"intermediate", s.config.intermediate_size},
          {"vocab", s.config.vocab_size},
          {"seq_len", s.seq_len},
          {"rows", s.rows},
          {"fwd_bwd_ms", median * 1e3},
          {"tokens_per_s", tokens / median},
          {"gflops", gflops},
          {"ratio_to_sgemm", gflops / sgemm},
          {"adamw_ms", opt_ms}};
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false;
  bool profile = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0)
      quick = true;
    else if (std::strcmp(argv[i], "--profile") == 0)
      profile = true;
    else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc)
      json_path = argv[++i];
    else {
      fmt::print(stderr, "usage: {} [--quick] [--profile] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  const int threads = omp_get_max_threads();
  const double sgemm = sgemm_gflops(2048, 4);
  fmt::print("OpenBLAS SGEMM (2048^3, best of runs): {:.1f} GFLOP/s on {} threads ({})\n", sgemm,
             threads, openblas_get_corename());

  std::vector<Shape> shapes = {
      {"small", make_config("small", 8192, 256, 768, 4, 4, 2), 8, 256},
      {"mid", make_config("mid", 32000, 1024, 2816, 8, 16, 4), 4, 512},
  };
  json results = json::array();
  for (const Shape& s : shapes) results.push_back(run(s, quick ? 1 : 3, sgemm, profile));

  if (!json_path.empty()) {
    const l3::core::BuildInfo build = l3::core::build_info();
    const json doc = {
        {"benchmark", "cpu_model"}, {"commit", build.git_commit},     {"threads", threads},
        {"sgemm_gflops", sgemm},    {"cpu", openblas_get_corename()}, {"models", results}};
    std::ofstream(json_path) << doc.dump(2) << '\n';
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
