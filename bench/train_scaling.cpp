// Strong scaling of the training driver on one node, for the mid-size CPU model (156M
// parameters: vocab 32000, hidden 1024, 8 layers, 16/4 heads, intermediate 2816):
//  1. baseline: rank 0 alone (a sub-communicator) trains with all the node's cores while the
//     other ranks wait without spinning;
//  2. the same global batch on every rank, the cores shared among them.
// Prints tokens/s of both, their ratio (ideal: the rank count when cores are not the limit,
// 1.0 when they are), and the share of the step spent in gradient reduction: the time the
// training thread waited for it after the backward pass (exposed) and the time the reductions
// took in total (overlapped or not), plus the ZeRO-1 parameter all-gather;
//  3. the same as 2 with ZeRO-2 (--shard-gradients): tokens/s against ZeRO-1's (each of the two
//     micro-batches is reduced, instead of once per step) and the gradient memory per rank.
//
//   mpiexec -n 2 l3-bench-train [--steps N] [--dir DIR] [--json FILE] [--no-overlap]
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_stats.hpp"
#include "core/build_info.hpp"
#include "dist/collectives.hpp"
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

constexpr std::int64_t kSeqLen = 512;
constexpr std::int64_t kGlobalBatch = 8;  // rows of 512 tokens per step

struct Figures {
  double tokens_per_s = 0;
  double step_ms = 0;
  double reduce_wait_ms = 0;
  double reduce_ms = 0;
  double gather_ms = 0;
  double data_wait_ms = 0;
};

// Median over the steps after the first two (warm-up: allocation, page cache, first GEMMs).
Figures run(const l3::dist::World& world, const std::string& dir, std::int64_t steps, bool overlap,
            bool shard_gradients = false) {
  l3::train::TrainConfig c;
  c.model = dir + "/config.json";
  c.data = dir + "/data";
  c.backend = l3::kernels::Backend::cpu;
  c.seq_len = kSeqLen;
  c.global_batch = kGlobalBatch;
  c.micro_batch = kGlobalBatch / world.size() / 2;  // two micro-batches per rank and step
  c.steps = steps;
  c.lr = 1e-4;
  c.log_every = 0;
  c.progress = l3::train::ProgressMode::never;
  c.overlap_reduction = overlap;
  c.shard_gradients = shard_gradients;
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
          median([](const auto& m) { return m.reduce_wait_ms; }),
          median([](const auto& m) { return m.reduce_ms; }),
          median([](const auto& m) { return m.gather_ms; }),
          median([](const auto& m) { return m.data_wait_ms; })};
}

// Waits for the other ranks without spinning a core (MPI_Barrier would busy-poll).
void idle_barrier(const l3::dist::World& world) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(world.comm(), &request);
  int done = 0;
  while (done == 0) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

json to_json(const Figures& f) {
  return {{"tokens_per_s", f.tokens_per_s},     {"step_ms", f.step_ms},
          {"reduce_wait_ms", f.reduce_wait_ms}, {"reduce_ms", f.reduce_ms},
          {"gather_ms", f.gather_ms},           {"data_wait_ms", f.data_wait_ms}};
}

}  // namespace

int main(int argc, char** argv) {
  l3::dist::MpiRuntime runtime(&argc, &argv);
  const l3::dist::World world(MPI_COMM_WORLD);
  std::int64_t steps = 8;
  std::string dir = (fs::temp_directory_path() / "l3-bench-train").string();
  std::string json_path;
  bool overlap = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoll(argv[++i]);
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    if (a == "--no-overlap") overlap = false;
  }
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (world.is_root()) l3::bench::write_mid_model_inputs(dir, 2'000'000);
  world.barrier();

  // 1. Rank 0 alone with every core.
  Figures alone;
  {
    std::optional<l3::dist::World> solo = world.split(world.is_root() ? 0 : MPI_UNDEFINED, 0);
    if (solo) {
      omp_set_num_threads(cores);
      alone = run(*solo, dir, steps, overlap);
    }
    idle_barrier(world);
  }
  // 2. Every rank, the cores shared.
  omp_set_num_threads(std::max(1, cores / world.size()));
  const Figures together = run(world, dir, steps, overlap);
  // 3. The same with ZeRO-2.
  const Figures zero2 = run(world, dir, steps, overlap, true);

  if (world.is_root()) {
    const double ratio = together.tokens_per_s / alone.tokens_per_s;
    fmt::print(
        "training strong scaling, mid-size model (156M parameters), global batch {} x {} tokens, "
        "{} cores\n"
        "  1 rank  ({} threads): {:8.0f} tokens/s, step {:6.0f} ms\n"
        "  {} ranks ({} thread{} each): {:8.0f} tokens/s, step {:6.0f} ms  -> {:.2f}x of 1 rank "
        "(ideal {} with enough cores; cores here: {})\n"
        "  gradient reduction: waited {:.1f} ms ({:.1f}% of the step), {:.1f} ms in reductions "
        "({:.1f}%, {}), parameter all-gather {:.1f} ms ({:.1f}%)\n",
        kGlobalBatch, kSeqLen, cores, cores, alone.tokens_per_s, alone.step_ms, world.size(),
        std::max(1, cores / world.size()), cores / world.size() == 1 ? "" : "s",
        together.tokens_per_s, together.step_ms, ratio, world.size(), cores,
        together.reduce_wait_ms, 100 * together.reduce_wait_ms / together.step_ms,
        together.reduce_ms, 100 * together.reduce_ms / together.step_ms,
        overlap ? "overlapped with the backward pass" : "after the backward pass",
        together.gather_ms, 100 * together.gather_ms / together.step_ms);
    // Gradient memory per rank (fp32 on the CPU): the whole buffer, or ZeRO-2's two slots and
    // this rank's share of the reduced gradients.
    const l3::model::ParameterLayout layout(l3::model::resolve_model(dir + "/config.json"),
                                            l3::model::HeadKind::language_model);
    const double zero1_mb = 4.0 * static_cast<double>(layout.total()) / (1 << 20);
    const double zero2_mb =
        4.0 *
        static_cast<double>(l3::model::gradient_slot_elements(layout) +
                            (layout.total() + world.size() - 1) / world.size()) /
        (1 << 20);
    fmt::print(
        "  ZeRO-2 ({} ranks): {:8.0f} tokens/s, step {:6.0f} ms -> {:.2f}x of ZeRO-1; reductions "
        "{:.1f} ms (waited {:.1f} ms); gradient memory per rank {:.0f} MiB vs {:.0f} MiB "
        "({:.2f}x)\n",
        world.size(), zero2.tokens_per_s, zero2.step_ms, zero2.tokens_per_s / together.tokens_per_s,
        zero2.reduce_ms, zero2.reduce_wait_ms, zero2_mb, zero1_mb, zero2_mb / zero1_mb);
    if (!json_path.empty()) {
      const l3::core::BuildInfo build = l3::core::build_info();
      std::ofstream(json_path) << json{{"benchmark", "train-scaling"},
                                       {"git_commit", build.git_commit},
                                       {"cores", cores},
                                       {"ranks", world.size()},
                                       {"steps", steps},
                                       {"overlap", overlap},
                                       {"one_rank", to_json(alone)},
                                       {"all_ranks", to_json(together)},
                                       {"speedup", ratio},
                                       {"zero2", to_json(zero2)},
                                       {"zero2_vs_zero1",
                                        zero2.tokens_per_s / together.tokens_per_s},
                                       {"zero2_gradient_mib", zero2_mb},
                                       {"zero1_gradient_mib", zero1_mb}}
                                      .dump(2)
                               << '\n';
    }
    fs::remove_all(dir);
  }
  return 0;
}
