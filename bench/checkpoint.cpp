// Checkpoint/restart costs for the mid-size CPU model (156M parameters: 1.87 GB of fp32 master
// weights and AdamW moments per checkpoint), each next to a baseline measured in the same run:
//  1. write bandwidth: a synchronous checkpoint (model.h5 + optim.h5 + checksums + the commit
//     protocol) against every rank write()-ing and fsync()-ing the same number of bytes to a
//     plain file of its own in the same directory at the same time, buffered and O_DIRECT
//     (the ratio is against the faster); alternated, median of --repeats;
//  2. training stall per checkpoint: the same steps without checkpoints, with asynchronous
//     checkpoints (the default) and with --checkpoint-sync; the stall is the extra wall time
//     per checkpoint (the steps plus the wait for the last write at the end);
//  3. restart: building the trainer from the newest checkpoint (find, verify every checksum,
//     read, reshard) until it can take its first step, against building it from scratch, and
//     with the quick verification (manifest and sizes only);
//  4. the node-local level (--ckpt-local in --local-dir, partner copies, the ranks pretending to
//     be on as many nodes): its stall per checkpoint (asynchronous and --checkpoint-sync)
//     against the global checkpoints' of item 2 on the same run, its restart against item 3's,
//     and the bytes written to --ckpt-dir per hour at equal protection (a restorable point
//     every --every steps: all of them global, or node-local with every --flush-every-th
//     flushed).
//
//   mpiexec -n 2 l3-bench-checkpoint [--dir DIR] [--local-dir DIR] [--repeats N] [--steps N]
//                                    [--every N] [--flush-every M] [--json FILE] [--only-write]
//                                    [--verbose] [--threads N]
// --threads: OpenMP threads per rank. By default the ranks' threads fill every core, and an
// asynchronous write competes with training for CPU time (copies, checksums, the disk I/O);
// fewer threads than cores leaves the writer a core, as on a GPU node.
// DIR should be on the file system the checkpoints go to (default: $TMPDIR); --local-dir on
// node-local storage (default: /dev/shm).
#include <fcntl.h>
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "bench_stats.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "core/build_info.hpp"
#include "core/timer.hpp"
#include "dist/mpi_runtime.hpp"
#include "dist/world.hpp"
#include "mid_model_inputs.hpp"
#include "model/parameter_layout.hpp"
#include "train/trainer.hpp"

namespace fs = std::filesystem;
using l3::bench::median;
using l3::core::Stopwatch;
using nlohmann::json;

namespace {

// The slowest rank's time of a collective piece of work that starts together.
template <typename Work>
double timed_together(const l3::dist::World& world, Work&& work) {
  world.barrier();
  const Stopwatch start;
  work();
  double local = start.seconds();
  double slowest = 0;
  MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, world.comm());
  return slowest;
}

// ---- 1. write bandwidth ----------------------------------------------------------------

// This rank's even share of the flat layout, filled with values that do not compress.
l3::ckpt::RankState rank_state(const l3::model::ParameterLayout& layout,
                               const l3::dist::World& world) {
  const std::int64_t total = layout.total();
  const std::int64_t begin = total * world.rank() / world.size();
  const std::int64_t end = total * (world.rank() + 1) / world.size();
  l3::ckpt::RankState state;
  state.allocate({{begin, end}});
  std::uint32_t x = 0x9e3779b9U ^ static_cast<std::uint32_t>(world.rank());
  for (auto* array : {&state.master, &state.exp_avg, &state.exp_avg_sq}) {
    for (float& v : *array) {
      x ^= x << 13U;
      x ^= x >> 17U;
      x ^= x << 5U;
      v = static_cast<float>(x) * 2.3283064e-10F - 0.5F;
    }
  }
  return state;
}

// write() the three arrays to one file in 64 MiB pieces, fsync, close: what any writer of the
// same bytes has to pay. `direct`: O_DIRECT from an aligned buffer (the bytes copied into it
// first, as the checkpoint writer does), the whole file in 8 MiB pieces.
void raw_write(const std::string& path, const l3::ckpt::RankState& state, bool direct) {
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path);
  constexpr std::size_t kPiece = std::size_t{8} << 20U;
  const std::unique_ptr<char, decltype(&std::free)> staging(
      static_cast<char*>(std::aligned_alloc(4096, kPiece)), &std::free);
  off_t at = 0;
  for (const auto* array : {&state.master, &state.exp_avg, &state.exp_avg_sq}) {
    const auto* bytes = reinterpret_cast<const char*>(array->data());
    const std::size_t size = array->size() * sizeof(float) / 4096 * 4096;  // whole blocks
    for (std::size_t done = 0; done < size;) {
      const std::size_t piece = std::min(kPiece, size - done);
      const char* from = bytes + done;
      if (direct) {
        std::memcpy(staging.get(), from, piece);
        from = staging.get();
      }
      const ssize_t n = ::pwrite(fd, from, piece, at);
      if (n <= 0) throw std::runtime_error("write failed on " + path);
      done += static_cast<std::size_t>(n);
      at += n;
    }
  }
  if (::fsync(fd) != 0) throw std::runtime_error("fsync failed on " + path);
  ::close(fd);
}

struct WriteFigures {
  double bytes = 0;
  double checkpoint_seconds = 0;
  double raw_seconds = 0;  // the faster of the two below
  double buffered_seconds = 0;
  double direct_seconds = 0;
};

WriteFigures measure_writes(const l3::dist::World& world, const std::string& dir, int repeats) {
  const l3::model::ParameterLayout layout(l3::bench::mid_model(),
                                          l3::model::HeadKind::language_model);
  const l3::ckpt::RankState state = rank_state(layout, world);
  const std::string root = dir + "/write-ckpt";
  // Nothing pruned while timing (the raw files are removed outside the timing too).
  l3::ckpt::CheckpointWriter writer(world, root, {.keep_last = repeats + 1, .async = false});
  std::vector<double> buffered;
  std::vector<double> direct;
  std::vector<double> checkpoint;
  double bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    const std::string raw_path = fmt::format("{}/raw-{}.bin", dir, world.rank());
    buffered.push_back(timed_together(world, [&] { raw_write(raw_path, state, false); }));
    fs::remove(raw_path);
    direct.push_back(timed_together(world, [&] { raw_write(raw_path, state, true); }));
    fs::remove(raw_path);
    l3::ckpt::Manifest manifest;
    manifest.step = r + 1;
    manifest.phase = l3::Phase::sft;
    manifest.model = layout.config();
    manifest.world_size = world.size();
    l3::ckpt::RankState snapshot = state;  // the trainer's snapshot, taken before the write
    checkpoint.push_back(timed_together(world, [&] {
      writer.write(layout, manifest, std::move(snapshot));
      const std::optional<l3::ckpt::WriteReport> report = writer.wait();
      if (report) bytes = static_cast<double>(report->bytes);
    }));
  }
  world.barrier();
  if (world.is_root()) fs::remove_all(root);
  const double b = median(buffered);
  const double d = median(direct);
  return {bytes, median(checkpoint), std::min(b, d), b, d};
}

// ---- 2. training stall, 3. restart -----------------------------------------------------

l3::train::TrainConfig train_config(const std::string& dir, const l3::dist::World& world,
                                    std::int64_t steps) {
  l3::train::TrainConfig c;
  c.model = dir + "/config.json";
  c.data = dir + "/data";
  c.backend = l3::kernels::Backend::cpu;
  c.seq_len = 128;
  c.global_batch = std::int64_t{2} * world.size();
  c.micro_batch = 2;
  c.steps = steps;
  c.lr = 1e-4;
  c.log_every = 0;
  c.progress = l3::train::ProgressMode::never;
  return c;
}

struct RunFigures {
  double seconds = 0;  // the steps, plus the wait for a write still in flight at the end
  double step_ms = 0;  // median step
  int checkpoints = 0;
  std::vector<double> step_seconds;
};

// The stall of each checkpoint whose interval lies within the run: the time its step and the
// `every` - 1 steps after it (while the write goes on) took beyond `baseline_ms` each.
std::vector<double> stall_per_checkpoint(const RunFigures& run, std::int64_t every,
                                         double baseline_ms) {
  std::vector<double> stalls;
  const auto n = static_cast<std::int64_t>(run.step_seconds.size());
  for (std::int64_t c = every; c + every - 1 <= n; c += every) {
    double extra = 0;
    for (std::int64_t i = c - 1; i < c + every - 1; ++i)
      extra += run.step_seconds[static_cast<std::size_t>(i)] - baseline_ms / 1000.0;
    stalls.push_back(extra);
  }
  return stalls;
}

// The mean of stalls[from...] (0 when there are none).
double mean_from(const std::vector<double>& stalls, std::size_t from) {
  if (stalls.size() <= from) return 0;
  double sum = 0;
  for (std::size_t i = from; i < stalls.size(); ++i) sum += stalls[i];
  return sum / static_cast<double>(stalls.size() - from);
}

enum class Checkpoints { none, async, sync, local, local_sync };

std::string mode_name(Checkpoints mode) {
  switch (mode) {
    case Checkpoints::none:
      return "none";
    case Checkpoints::async:
      return "async";
    case Checkpoints::sync:
      return "sync";
    case Checkpoints::local:
      return "node-local";
    case Checkpoints::local_sync:
      return "node-local sync";
  }
  return "";
}

// The node-local level of the runs (flushing never: what is measured is the level itself).
std::string local_pattern;

RunFigures timed_run(const l3::dist::World& world, const l3::core::Logger& log,
                     const std::string& dir, std::int64_t steps, std::int64_t every,
                     Checkpoints mode) {
  l3::train::TrainConfig c = train_config(dir, world, steps);
  const std::string root = fmt::format("{}/run-{}", dir, static_cast<int>(mode));
  if (mode != Checkpoints::none) {
    c.ckpt_dir = root;
    c.checkpoint_sync = mode == Checkpoints::sync || mode == Checkpoints::local_sync;
    c.resume = {.mode = l3::ckpt::ResumeMode::none, .path = {}};
  }
  if (mode == Checkpoints::async || mode == Checkpoints::sync) c.checkpoint_every = every;
  if (mode == Checkpoints::local || mode == Checkpoints::local_sync) {
    c.ckpt_local = local_pattern;
    c.checkpoint_every_local = every;
    c.flush_every = 0;
  }
  std::vector<double> step_seconds;
  std::optional<l3::train::Trainer> trainer(std::in_place, world, log, c);
  const double seconds = timed_together(world, [&] {
    for (;;) {
      const Stopwatch start;
      if (!trainer->step()) break;
      step_seconds.push_back(start.seconds());
    }
    trainer.reset();  // waits for the write in flight
  });
  if (log.enabled(l3::core::LogLevel::info) && world.is_root()) {
    std::string line;
    for (const double s : step_seconds) line += fmt::format(" {:.0f}", 1000 * s);
    fmt::print(stderr, "  step times (ms), checkpoints {}:{}\n", mode_name(mode), line);
  }
  const double step_ms = 1000 * median(step_seconds);
  return {seconds, step_ms, mode == Checkpoints::none ? 0 : static_cast<int>(steps / every),
          std::move(step_seconds)};
}

struct RestartFigures {
  double fresh_seconds = 0;   // trainer built from scratch
  double resume_seconds = 0;  // from the newest checkpoint, every checksum verified
  double quick_seconds = 0;   // manifest and sizes only
  double local_seconds = 0;   // from the node-local level, every checksum verified
};

RestartFigures measure_restart(const l3::dist::World& world, const l3::core::Logger& log,
                               const std::string& dir, std::int64_t steps) {
  RestartFigures f;
  l3::train::TrainConfig c = train_config(dir, world, steps + 4);
  f.fresh_seconds = timed_together(world, [&] { l3::train::Trainer trainer(world, log, c); });
  c.ckpt_dir = fmt::format("{}/run-{}", dir, static_cast<int>(Checkpoints::sync));
  c.resume = {.mode = l3::ckpt::ResumeMode::automatic, .path = {}};
  c.verify_resume = true;
  f.resume_seconds = timed_together(world, [&] {
    const l3::train::Trainer trainer(world, log, c);
    if (trainer.steps_done() == 0) throw std::runtime_error("the restart did not resume");
  });
  c.verify_resume = false;
  f.quick_seconds = timed_together(world, [&] { l3::train::Trainer trainer(world, log, c); });
  // From the node-local level (every file checked), where the local runs left it.
  c.ckpt_dir = fmt::format("{}/run-{}", dir, static_cast<int>(Checkpoints::local_sync));
  c.ckpt_local = local_pattern;
  c.checkpoint_every_local = 1000;
  c.verify_resume = true;
  f.local_seconds = timed_together(world, [&] {
    const l3::train::Trainer trainer(world, log, c);
    if (trainer.steps_done() == 0) throw std::runtime_error("the restart did not resume");
  });
  return f;
}

}  // namespace

int main(int argc, char** argv) try {
  l3::dist::MpiRuntime runtime(&argc, &argv);
  const l3::dist::World world(MPI_COMM_WORLD);
  std::string dir = (fs::temp_directory_path() / "l3-bench-checkpoint").string();
  std::string json_path;
  int repeats = 3;
  std::int64_t steps = 17;
  std::int64_t every = 5;
  std::int64_t flush_every = 10;
  std::string local_dir = "/dev/shm/l3-bench-checkpoint-local";
  bool only_write = false;
  bool verbose = false;  // the trainer's log (checkpoint and snapshot times)
  int threads = 0;       // OpenMP threads per rank (default: the cores shared among the ranks)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    if (a == "--repeats" && i + 1 < argc) repeats = std::stoi(argv[++i]);
    if (a == "--steps" && i + 1 < argc) steps = std::stoll(argv[++i]);
    if (a == "--every" && i + 1 < argc) every = std::stoll(argv[++i]);
    if (a == "--flush-every" && i + 1 < argc) flush_every = std::stoll(argv[++i]);
    if (a == "--local-dir" && i + 1 < argc) local_dir = argv[++i];
    if (a == "--only-write") only_write = true;
    if (a == "--verbose") verbose = true;
    if (a == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
  }
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (threads <= 0) threads = std::max(1, cores / world.size());
  omp_set_num_threads(threads);
  if (world.is_root()) {
    fs::remove_all(dir);
    fs::remove_all(local_dir);
    l3::bench::write_mid_model_inputs(dir, 200'000);
  }
  world.barrier();
  const l3::core::Logger log(
      world.rank(), world.size(),
      {.level = verbose ? l3::core::LogLevel::info : l3::core::LogLevel::warn});

  const WriteFigures w = measure_writes(world, dir, repeats);
  if (only_write) {
    if (world.is_root()) {
      fmt::print("write: {:.2f} GB in {:.2f} s, raw {:.2f} s -> {:.0f}% of raw\n", w.bytes / 1e9,
                 w.checkpoint_seconds, w.raw_seconds, 100 * w.raw_seconds / w.checkpoint_seconds);
      fs::remove_all(dir);
    }
    return 0;
  }
  const RunFigures sync = timed_run(world, log, dir, steps, every, Checkpoints::sync);
  const RunFigures none = timed_run(world, log, dir, steps, every, Checkpoints::none);
  const RunFigures async = timed_run(world, log, dir, steps, every, Checkpoints::async);
  // Partner copies need other nodes: on one machine the ranks pretend to be on as many.
  if (world.size() > 1) setenv("L3_PRETEND_NODES", std::to_string(world.size()).c_str(), 0);
  local_pattern = local_dir + "/%h";
  const RunFigures local = timed_run(world, log, dir, steps, every, Checkpoints::local);
  // Its files go (on /dev/shm they are memory); the synchronous run's stay for the restart.
  world.barrier();
  if (world.is_root()) fs::remove_all(local_dir);
  world.barrier();
  const RunFigures local_sync = timed_run(world, log, dir, steps, every, Checkpoints::local_sync);
  const RestartFigures r = measure_restart(world, log, dir, steps);

  if (world.is_root()) {
    const double raw_gbs = w.bytes / w.raw_seconds / 1e9;
    const double ckpt_gbs = w.bytes / w.checkpoint_seconds / 1e9;
    const double async_stall = (async.seconds - none.seconds) / async.checkpoints;
    const double sync_stall = (sync.seconds - none.seconds) / sync.checkpoints;
    const double local_stall = (local.seconds - none.seconds) / local.checkpoints;
    const double local_sync_stall = (local_sync.seconds - none.seconds) / local_sync.checkpoints;
    // In steady state: from the third checkpoint on, when the node-local level writes over the
    // files of the step before last instead of allocating new storage.
    const auto steady = [&](const RunFigures& run) {
      return mean_from(stall_per_checkpoint(run, every, none.step_ms), 2);
    };
    const double steady_async = steady(async);
    const double steady_sync = steady(sync);
    const double steady_local = steady(local);
    const double steady_local_sync = steady(local_sync);
    // A checkpoint of every rank's state every `every` steps, at the uninterrupted step time.
    const double global_gb_per_hour =
        w.bytes / 1e9 * 3600.0 / (static_cast<double>(every) * none.step_ms / 1000.0);
    fmt::print(
        "checkpoint/restart, mid-size model (156M parameters), {} ranks x {} threads, {} cores, "
        "in {}\n"
        "  write: {:.2f} GB per checkpoint in {:.2f} s = {:.2f} GB/s; raw write()+fsync of the "
        "same bytes, one file per rank: {:.2f} s buffered, {:.2f} s O_DIRECT -> {:.0f}% of the "
        "faster (median of {})\n"
        "  {} steps ({} tokens each), checkpoint every {}: without {:.1f} s (step {:.0f} ms), "
        "async {:.1f} s, sync {:.1f} s\n"
        "  stall per checkpoint: async {:.2f} s, sync {:.2f} s -> async is {:.0f}% of sync\n"
        "  restart to the first step: {:.2f} s with every checksum verified, {:.2f} s quick; "
        "from scratch {:.2f} s\n"
        "  node-local level in {} (partner copies, {} pretended nodes): {:.1f} s async, {:.1f} s "
        "sync\n"
        "  stall per node-local checkpoint: async {:.3f} s ({:.0f}% of a global async one), "
        "sync {:.3f} s ({:.0f}% of a global sync one); restart from it {:.2f} s\n"
        "  from the third checkpoint on (steady state; from step times against the median "
        "step without checkpoints): global async {:.3f} s, sync {:.3f} s; node-local async "
        "{:.3f} s ({:.0f}%), sync {:.3f} s ({:.0f}%)\n"
        "  written to --ckpt-dir per hour at a restorable point every {} steps: {:.1f} GB all "
        "global, {:.1f} GB node-local with every {}th flushed\n",
        world.size(), threads, cores, dir, w.bytes / 1e9, w.checkpoint_seconds, ckpt_gbs,
        w.buffered_seconds, w.direct_seconds, 100 * ckpt_gbs / raw_gbs, repeats, steps,
        128 * 2 * world.size(), every, none.seconds, none.step_ms, async.seconds, sync.seconds,
        async_stall, sync_stall, 100 * async_stall / sync_stall, r.resume_seconds, r.quick_seconds,
        r.fresh_seconds, local_dir, world.size(), local.seconds, local_sync.seconds, local_stall,
        100 * local_stall / async_stall, local_sync_stall, 100 * local_sync_stall / sync_stall,
        r.local_seconds, steady_async, steady_sync, steady_local, 100 * steady_local / steady_async,
        steady_local_sync, 100 * steady_local_sync / steady_sync, every, global_gb_per_hour,
        global_gb_per_hour / static_cast<double>(flush_every), flush_every);
    if (!json_path.empty()) {
      const l3::core::BuildInfo build = l3::core::build_info();
      std::ofstream(json_path)
          << json{{"benchmark", "checkpoint"},
                  {"git_commit", build.git_commit},
                  {"cores", cores},
                  {"ranks", world.size()},
                  {"threads_per_rank", threads},
                  {"bytes_per_checkpoint", w.bytes},
                  {"write",
                   {{"checkpoint_seconds", w.checkpoint_seconds},
                    {"checkpoint_gb_per_s", ckpt_gbs},
                    {"raw_seconds", w.raw_seconds},
                    {"raw_buffered_seconds", w.buffered_seconds},
                    {"raw_direct_seconds", w.direct_seconds},
                    {"raw_gb_per_s", raw_gbs},
                    {"fraction_of_raw", ckpt_gbs / raw_gbs},
                    {"repeats", repeats}}},
                  {"stall",
                   {{"steps", steps},
                    {"every", every},
                    {"checkpoints", async.checkpoints},
                    {"no_checkpoint_seconds", none.seconds},
                    {"async_seconds", async.seconds},
                    {"sync_seconds", sync.seconds},
                    {"step_ms", none.step_ms},
                    {"async_stall_seconds", async_stall},
                    {"sync_stall_seconds", sync_stall},
                    {"async_over_sync", async_stall / sync_stall}}},
                  {"node_local",
                   {{"directory", local_dir},
                    {"redundancy", "partner"},
                    {"pretended_nodes", world.size()},
                    {"async_seconds", local.seconds},
                    {"sync_seconds", local_sync.seconds},
                    {"async_stall_seconds", local_stall},
                    {"sync_stall_seconds", local_sync_stall},
                    {"async_stall_over_global_async", local_stall / async_stall},
                    {"sync_stall_over_global_sync", local_sync_stall / sync_stall},
                    {"restart_seconds", r.local_seconds},
                    {"steady_state",
                     {{"from_checkpoint", 3},
                      {"global_async_stall_seconds", steady_async},
                      {"global_sync_stall_seconds", steady_sync},
                      {"async_stall_seconds", steady_local},
                      {"sync_stall_seconds", steady_local_sync}}},
                    {"flush_every", flush_every},
                    {"ckpt_dir_gb_per_hour_global", global_gb_per_hour},
                    {"ckpt_dir_gb_per_hour_node_local",
                     global_gb_per_hour / static_cast<double>(flush_every)}}},
                  {"restart",
                   {{"verified_seconds", r.resume_seconds},
                    {"quick_seconds", r.quick_seconds},
                    {"fresh_seconds", r.fresh_seconds}}}}
                 .dump(2)
          << '\n';
    }
    fs::remove_all(dir);
    fs::remove_all(local_dir);
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
