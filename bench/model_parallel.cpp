// Context and tensor parallelism (--context-parallel C, --tensor-parallel T) on the CPU, in one
// run: one long sequence per step (16,384 tokens by default) through the benchmarks' mid-size
// model (156M parameters, 16 heads, 4 key/value heads, its positions raised to the sequence),
// trained on the first N ranks of the job: 1 rank, CP 2 and 4, TP 2 and 4 (as the job's ranks
// allow; the other ranks wait asleep). Per layout: tokens/s (median of the steps after the
// first) and the ratio to 1 rank, the baseline (N ranks of cores / N threads each use the
// node's cores as one rank of all of them does: 1.0 means the split costs nothing), and each
// rank's memory: what the backend allocated against the memory plan's total
// (`--dry-run-memory`; under TP a rank also holds the exchange's host staging, which the plan
// counts and the backend does not allocate).
//
//   mpiexec -n 4 l3-bench-model-parallel [--tokens N] [--steps N] [--dir DIR] [--json FILE]
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "bench_stats.hpp"
#include "core/build_info.hpp"
#include "dist/collectives.hpp"
#include "dist/mpi_runtime.hpp"
#include "dist/wait_policy.hpp"
#include "dist/world.hpp"
#include "mid_model_inputs.hpp"
#include "model/memory_plan.hpp"
#include "train/memory_check.hpp"
#include "train/trainer.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Figures {
  double tokens_per_s = 0;
  double step_ms = 0;
  std::int64_t allocated = 0;  // the largest of the ranks'
  std::int64_t planned = 0;
};

struct Layout {
  int context = 1;
  int tensor = 1;
  [[nodiscard]] int ranks() const noexcept { return context * tensor; }
};

l3::train::TrainConfig config_for(const std::string& dir, std::int64_t tokens, std::int64_t steps,
                                  Layout layout) {
  l3::train::TrainConfig c;
  c.model = dir + "/config.json";
  c.data = dir + "/data";
  c.backend = l3::kernels::Backend::cpu;
  c.seq_len = tokens;
  c.global_batch = 1;
  c.micro_batch = 1;
  c.steps = steps;
  c.lr = 1e-4;
  c.log_every = 0;
  c.progress = l3::train::ProgressMode::never;
  c.context_parallel = layout.context;
  c.tensor_parallel = layout.tensor;
  return c;
}

// The run on `group` (C ranks); every rank of it returns the figures.
Figures run(const l3::dist::World& group, const std::string& dir, const l3::model::ModelConfig& m,
            std::int64_t tokens, std::int64_t steps, Layout layout) {
  const l3::train::TrainConfig c = config_for(dir, tokens, steps, layout);
  const l3::core::Logger quiet(group.rank(), group.size(), {.level = l3::core::LogLevel::warn});
  l3::train::Trainer trainer(group, quiet, c);
  std::vector<l3::train::StepMetrics> all;
  trainer.on_step([&](const l3::train::StepMetrics& s) { all.push_back(s); });
  (void)trainer.run();
  const auto skip = static_cast<std::ptrdiff_t>(std::min<std::size_t>(1, all.size()));
  const std::vector<l3::train::StepMetrics> kept(all.begin() + skip, all.end());
  Figures f;
  f.tokens_per_s = l3::bench::median_of(kept, [](const auto& s) { return s.tokens_per_s; });
  f.step_ms = l3::bench::median_of(kept, [](const auto& s) { return s.step_ms; });
  f.allocated = l3::dist::all_reduce(group.comm(), trainer.backend_allocated_bytes(),
                                     l3::dist::ReduceOp::max);
  f.planned =
      l3::model::plan_training_memory(l3::train::memory_plan_input(c, m, false, group.size()))
          .total();
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  l3::dist::MpiRuntime runtime(&argc, &argv);
  const l3::dist::World world(MPI_COMM_WORLD);
  std::int64_t tokens = 16384;
  std::int64_t steps = 3;
  std::string root = (fs::temp_directory_path() / "l3-bench-model-parallel").string();
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokens" && i + 1 < argc) tokens = std::stoll(argv[++i]);
    if (a == "--steps" && i + 1 < argc) steps = std::stoll(argv[++i]);
    if (a == "--dir" && i + 1 < argc) root = argv[++i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
  }
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  // More ranks than cores: wait without spinning (as the CLI does: dist/thread_budget.hpp), or
  // each layer's exchanges cost scheduler time slices.
  l3::dist::set_wait_policy(world.size() > cores ? l3::dist::WaitPolicy::passive
                                                 : l3::dist::WaitPolicy::active);
  l3::model::ModelConfig model = l3::bench::mid_model();
  model.max_position_embeddings = std::max<std::int64_t>(model.max_position_embeddings, tokens);
  if (world.is_root()) l3::bench::write_model_inputs(root, model, tokens * (steps + 1), tokens);
  world.barrier();

  json results = json::array();
  std::optional<Figures> baseline;
  for (const Layout layout :
       {Layout{1, 1}, Layout{2, 1}, Layout{4, 1}, Layout{1, 2}, Layout{1, 4}}) {
    const int ranks = layout.ranks();
    if (ranks > world.size()) continue;
    const std::optional<l3::dist::World> group =
        world.split(world.rank() < ranks ? 0 : MPI_UNDEFINED, world.rank());
    Figures f;
    if (group) {
      omp_set_num_threads(std::max(1, cores / ranks));
      f = run(*group, root, model, tokens, steps, layout);
    }
    l3::dist::quiet_barrier(world.comm());
    if (!world.is_root()) continue;
    if (!baseline) baseline = f;
    const double ratio = f.tokens_per_s / baseline->tokens_per_s;
    constexpr double kMiB = 1024.0 * 1024.0;
    const int threads = std::max(1, cores / ranks);
    const std::string name = layout.tensor > 1 ? fmt::format("tensor parallel {}", layout.tensor)
                             : layout.context > 1
                                 ? fmt::format("context parallel {}", layout.context)
                                 : std::string("1 rank");
    fmt::print(
        "{:<18} ({} thread{} per rank): {:8.0f} tokens/s, step {:8.1f} ms -> "
        "{:.3f}x of 1 rank; memory per rank {:.1f} MiB allocated, plan {:.1f} MiB ({:.3f})\n",
        name, threads, threads == 1 ? "" : "s", f.tokens_per_s, f.step_ms, ratio,
        static_cast<double>(f.allocated) / kMiB, static_cast<double>(f.planned) / kMiB,
        static_cast<double>(f.allocated) / static_cast<double>(f.planned));
    results.push_back({{"context_parallel", layout.context},
                       {"tensor_parallel", layout.tensor},
                       {"threads_per_rank", threads},
                       {"tokens_per_s", f.tokens_per_s},
                       {"step_ms", f.step_ms},
                       {"vs_one_rank", ratio},
                       {"allocated_bytes_per_rank", f.allocated},
                       {"planned_bytes_per_rank", f.planned}});
  }
  if (world.is_root()) {
    if (!json_path.empty()) {
      const l3::core::BuildInfo build = l3::core::build_info();
      std::ofstream(json_path) << json{{"benchmark", "model_parallel"},
                                       {"git_commit", build.git_commit},
                                       {"cores", cores},
                                       {"ranks", world.size()},
                                       {"tokens", tokens},
                                       {"steps", steps},
                                       {"model", "mid"},
                                       {"results", results}}
                                      .dump(2)
                               << '\n';
    }
    fs::remove_all(root);
  }
  return 0;
}
