// ZeRO-3 (--shard-parameters) against ZeRO-2 (--shard-gradients) on the CPU, in one run, for
// the `tiny` model and the benchmarks' mid-size model (156M parameters), on every rank of the
// job (2 by default): tokens/s of
//  1. ZeRO-2 (the baseline: every rank holds the whole weights);
//  2. ZeRO-3 with the next layer group gathered while one computes (the default);
//  3. ZeRO-3 gathering each group only when it is reached (--no-prefetch-gathers);
// the ratio of 2 and 3 to 1, and the share of the gather time hidden behind compute in 2
// (1 - what the training thread waited for the gathers / the time they took), plus the weight
// memory per rank (whole model against 1/N plus the gather buffers).
//
//   mpiexec -n 2 l3-bench-zero3 [--steps N] [--dir DIR] [--json FILE]
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_stats.hpp"
#include "core/build_info.hpp"
#include "dist/mpi_runtime.hpp"
#include "dist/world.hpp"
#include "mid_model_inputs.hpp"
#include "model/memory_plan.hpp"
#include "model/model_config.hpp"
#include "model/parameter_layout.hpp"
#include "train/trainer.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

enum class Mode { zero2, zero3, zero3_no_prefetch };

struct Figures {
  double tokens_per_s = 0;
  double step_ms = 0;
  double gather_ms = 0;       // the gathers' own time
  double gather_wait_ms = 0;  // what the step waited for them
};

struct Shape {
  const char* name;
  std::int64_t seq_len;
  std::int64_t global_batch;  // rows per step, over all ranks
};

// Median over the steps after the first two (warm-up).
Figures run(const l3::dist::World& world, const std::string& dir, const Shape& shape,
            std::int64_t steps, Mode mode) {
  l3::train::TrainConfig c;
  c.model = dir + "/config.json";
  c.data = dir + "/data";
  c.backend = l3::kernels::Backend::cpu;
  c.seq_len = shape.seq_len;
  c.global_batch = shape.global_batch;
  c.micro_batch = shape.global_batch / world.size();
  c.steps = steps;
  c.lr = 1e-4;
  c.log_every = 0;
  c.progress = l3::train::ProgressMode::never;
  c.shard_gradients = true;
  c.shard_parameters = mode != Mode::zero2;
  c.prefetch_gathers = mode == Mode::zero3;
  const l3::core::Logger quiet(world.rank(), world.size(), {.level = l3::core::LogLevel::warn});
  l3::train::Trainer trainer(world, quiet, c);
  std::vector<l3::train::StepMetrics> all;
  trainer.on_step([&](const l3::train::StepMetrics& m) { all.push_back(m); });
  (void)trainer.run();
  const auto skip = static_cast<std::ptrdiff_t>(std::min<std::size_t>(2, all.size()));
  const std::vector<l3::train::StepMetrics> kept(all.begin() + skip, all.end());
  const auto median = [&](auto field) { return l3::bench::median_of(kept, field); };
  return {median([](const auto& m) { return m.tokens_per_s; }),
          median([](const auto& m) { return m.step_ms; }),
          median([](const auto& m) { return m.gather_ms; }),
          median([](const auto& m) { return m.gather_wait_ms; })};
}

json to_json(const Figures& f) {
  return {{"tokens_per_s", f.tokens_per_s},
          {"step_ms", f.step_ms},
          {"gather_ms", f.gather_ms},
          {"gather_wait_ms", f.gather_wait_ms}};
}

}  // namespace

int main(int argc, char** argv) {
  l3::dist::MpiRuntime runtime(&argc, &argv);
  const l3::dist::World world(MPI_COMM_WORLD);
  std::int64_t steps = 8;
  std::string root = (fs::temp_directory_path() / "l3-bench-zero3").string();
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoll(argv[++i]);
    if (a == "--dir" && i + 1 < argc) root = argv[++i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
  }
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  omp_set_num_threads(std::max(1, cores / world.size()));

  json results = json::array();
  for (const Shape& shape : {Shape{"tiny", 256, 16}, Shape{"mid", 512, 4}}) {
    const l3::model::ModelConfig model =
        std::string(shape.name) == "tiny" ? l3::model::preset("tiny") : l3::bench::mid_model();
    const std::string dir = root + "/" + shape.name;
    if (world.is_root()) l3::bench::write_model_inputs(dir, model, 1'000'000);
    world.barrier();
    const Figures zero2 = run(world, dir, shape, steps, Mode::zero2);
    const Figures zero3 = run(world, dir, shape, steps, Mode::zero3);
    const Figures plain = run(world, dir, shape, steps, Mode::zero3_no_prefetch);
    if (world.is_root()) {
      const l3::model::ParameterLayout layout(model, l3::model::HeadKind::language_model);
      const double whole_mib = 4.0 * static_cast<double>(layout.total()) / (1 << 20);
      const double zero3_mib =
          4.0 *
          static_cast<double>((layout.total() + world.size() - 1) / world.size() +
                              l3::model::gradient_slot_elements(layout)) /
          (1 << 20);
      const double hidden =
          zero3.gather_ms > 0 ? 1.0 - zero3.gather_wait_ms / zero3.gather_ms : 0.0;
      fmt::print(
          "{} ({:.1f}M parameters), {} ranks x {} threads, {} rows x {} tokens per step:\n"
          "  ZeRO-2:                 {:8.0f} tokens/s, step {:7.1f} ms\n"
          "  ZeRO-3 (prefetch):      {:8.0f} tokens/s, step {:7.1f} ms -> {:.3f}x of ZeRO-2; "
          "gathers {:.1f} ms, waited {:.1f} ms: {:.0f}% hidden\n"
          "  ZeRO-3 (no prefetch):   {:8.0f} tokens/s, step {:7.1f} ms -> {:.3f}x of ZeRO-2; "
          "gathers {:.1f} ms, all waited for\n"
          "  weights per rank: {:.1f} MiB whole (ZeRO-2) vs {:.1f} MiB (ZeRO-3: 1/{} + gather "
          "buffers)\n",
          shape.name, static_cast<double>(layout.parameter_count()) / 1e6, world.size(),
          std::max(1, cores / world.size()), shape.global_batch, shape.seq_len, zero2.tokens_per_s,
          zero2.step_ms, zero3.tokens_per_s, zero3.step_ms, zero3.tokens_per_s / zero2.tokens_per_s,
          zero3.gather_ms, zero3.gather_wait_ms, 100.0 * hidden, plain.tokens_per_s, plain.step_ms,
          plain.tokens_per_s / zero2.tokens_per_s, plain.gather_ms, whole_mib, zero3_mib,
          world.size());
      results.push_back({{"model", shape.name},
                         {"parameters", layout.parameter_count()},
                         {"seq_len", shape.seq_len},
                         {"global_batch", shape.global_batch},
                         {"zero2", to_json(zero2)},
                         {"zero3", to_json(zero3)},
                         {"zero3_no_prefetch", to_json(plain)},
                         {"zero3_vs_zero2", zero3.tokens_per_s / zero2.tokens_per_s},
                         {"zero3_no_prefetch_vs_zero2", plain.tokens_per_s / zero2.tokens_per_s},
                         {"gather_hidden", hidden},
                         {"weights_mib_zero2", whole_mib},
                         {"weights_mib_zero3", zero3_mib}});
    }
  }
  if (world.is_root()) {
    if (!json_path.empty()) {
      const l3::core::BuildInfo build = l3::core::build_info();
      std::ofstream(json_path) << json{{"benchmark", "zero3"}, {"git_commit", build.git_commit},
                                       {"cores", cores},       {"ranks", world.size()},
                                       {"steps", steps},       {"results", results}}
                                      .dump(2)
                               << '\n';
    }
    fs::remove_all(root);
  }
  return 0;
}
