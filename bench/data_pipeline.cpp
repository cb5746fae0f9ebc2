// Data pipeline benchmark (run under mpiexec, any rank count):
//  1. throughput of the loader (GB/s of tokens + masks delivered, shuffled whole documents)
//     next to a raw sequential read() of the same shard bytes in the same run, page cache warm
//     and cold (posix_fadvise DONTNEED evicts the shards between runs);
//  2. data-wait: a consumer that "computes" T ms per step (sleeps), at prefetch depth 1
//     (no overlap) and 2, 4: data_wait ms per step and its fraction of the step time.
//
//   mpiexec -n 1 l3-bench-data-pipeline [--dir DIR] [--megatokens N] [--json FILE]
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/rng.hpp"
#include "core/timer.hpp"
#include "dist/mpi_runtime.hpp"
#include "dist/world.hpp"
#include "io/data/data_loader.hpp"
#include "io/data/shard_format.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kShards = 4;

// Shards of random tokens in documents of 64..2048 tokens, and their index.json.
void make_dataset(const std::string& dir, std::int64_t tokens) {
  fs::create_directories(dir);
  json shards = json::array();
  const l3::core::CounterRng rng(21, l3::core::RngPurpose::test);
  std::uint64_t draw = 0;
  for (int s = 0; s < kShards; ++s) {
    l3::data::Documents docs;
    while (docs.token_count() < tokens / kShards) {
      const auto length = static_cast<std::size_t>(64 + rng.below(draw++, 1985));
      std::vector<std::int32_t> t(length);
      for (auto& x : t) x = static_cast<std::int32_t>(rng.below(draw++, 128000));
      docs.add(t, std::vector<std::uint8_t>(length, 1));
    }
    const std::string name = fmt::format("part-{:05}.h5", s);
    l3::data::write_sft_shard(fmt::format("{}/{}", dir, name), docs,
                              {"llama3-hpc/sft", 1, "bench", 128256});
    shards.push_back({{"file", name}, {"documents", docs.count()}, {"tokens", docs.token_count()}});
  }
  std::ofstream(dir + "/index.json") << json{
      {"format", "llama3-hpc/sft"},
      {"version", 1},
      {"tokenizer", {{"sha256", "bench"}, {"vocab_size", 128256}}},
      {"shards", shards}}.dump();
}

void evict(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);  // NOLINT(cppcoreguidelines-pro-type-vararg)
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// GB/s of a sequential read() of every shard.
double raw_read(const std::string& dir) {
  std::vector<char> buffer(1 << 22);
  std::int64_t bytes = 0;
  const l3::core::Stopwatch watch;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".h5") continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);  // NOLINT(cppcoreguidelines-pro-type-vararg)
    ssize_t n = 0;
    while ((n = ::read(fd, buffer.data(), buffer.size())) > 0) bytes += n;
    ::close(fd);
  }
  return static_cast<double>(bytes) / watch.seconds() / 1e9;
}

l3::data::LoaderConfig loader_config(int ranks, int depth) {
  l3::data::LoaderConfig c;
  c.plan.seq_len = 2048;
  c.plan.global_batch = std::int64_t{32} * ranks;
  c.plan.micro_batch = 32;
  c.plan.seed = 1;
  c.depth = depth;
  c.model_vocab = 128256;
  return c;
}

}  // namespace

int main(int argc, char** argv) try {
  l3::dist::MpiRuntime runtime(&argc, &argv);
  const l3::dist::World world(MPI_COMM_WORLD);
  std::string dir = (fs::temp_directory_path() / "l3-bench-data").string();
  std::int64_t megatokens = 128;
  std::string json_path;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--dir") == 0 && a + 1 < argc)
      dir = argv[++a];
    else if (std::strcmp(argv[a], "--megatokens") == 0 && a + 1 < argc)
      megatokens = std::stoll(argv[++a]);
    else if (std::strcmp(argv[a], "--json") == 0 && a + 1 < argc)
      json_path = argv[++a];
  }
  if (world.is_root() && !fs::exists(dir + "/index.json")) make_dataset(dir, megatokens << 20);
  world.barrier();
  const auto index =
      l3::data::open_dataset(world, dir, {l3::data::SampleKind::sft, 128256, "", false});
  json results = {
      {"benchmark", "data_pipeline"}, {"ranks", world.size()}, {"tokens", index.total_tokens()}};

  // 1. Throughput: one pass over the data, no compute, warm then cold.
  for (const bool cold : {false, true}) {
    if (world.is_root() && cold) evict(dir);
    world.barrier();
    const double raw = world.is_root() ? raw_read(dir) : 0.0;  // the baseline, on rank 0
    if (world.is_root() && cold) evict(dir);
    world.barrier();
    l3::data::DataLoader loader(world, index, loader_config(world.size(), 2), {0, 0});
    const std::int64_t steps = loader.steps_in_epoch(0);
    std::int64_t bytes = 0;
    const l3::core::Stopwatch watch;
    for (std::int64_t s = 0; s < steps; ++s) {
      for (const auto& b : loader.next().micro)
        bytes += b.tokens_count() * 5;  // u32 tokens + u8 mask
    }
    double seconds = watch.seconds();
    MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_INT64_T, MPI_SUM, world.comm());
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, world.comm());
    const double gbps = static_cast<double>(bytes) / seconds / 1e9;
    if (world.is_root()) {
      fmt::print(
          "{} cache: loader {:.2f} GB/s delivered ({} steps of {} rows x 2048), raw read() {:.2f} "
          "GB/s, ratio {:.2f}\n",
          cold ? "cold" : "warm", gbps, steps, 32 * world.size(), raw, gbps / raw);
      results[cold ? "cold" : "warm"] = {
          {"loader_gb_per_s", gbps}, {"raw_read_gb_per_s", raw}, {"ratio", gbps / raw}};
    }
  }

  // 2. Data wait while "computing": what the accelerator would lose at each depth.
  json waits = json::array();
  for (const double compute_ms : {20.0, 80.0}) {
    for (const int depth : {1, 2, 4}) {
      l3::data::DataLoader loader(world, index, loader_config(world.size(), depth), {0, 0});
      const std::int64_t steps = std::min<std::int64_t>(40, loader.steps_in_epoch(0));
      double wait_ms = 0;
      double assemble = 0;
      const l3::core::Stopwatch watch;
      for (std::int64_t s = 0; s < steps; ++s) {
        const auto& step = loader.next();
        if (s > 0) wait_ms += loader.last_wait_ms();  // step 0 has nothing to overlap with
        assemble += step.assemble_seconds;
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(compute_ms));
      }
      const double step_ms = watch.seconds() * 1e3 / static_cast<double>(steps);
      const double per_step = wait_ms / static_cast<double>(steps - 1);
      if (world.is_root()) {
        fmt::print(
            "compute {:3.0f} ms/step, depth {}: data wait {:7.3f} ms/step = {:5.2f}% of the step "
            "(producer {:.1f} ms/step)\n",
            compute_ms, depth, per_step, 100 * per_step / step_ms,
            assemble * 1e3 / static_cast<double>(steps));
        waits.push_back({{"compute_ms", compute_ms},
                         {"depth", depth},
                         {"data_wait_ms", per_step},
                         {"fraction", per_step / step_ms},
                         {"producer_ms", assemble * 1e3 / static_cast<double>(steps)}});
      }
    }
  }
  results["data_wait"] = waits;
  if (world.is_root() && !json_path.empty()) std::ofstream(json_path) << results.dump(2) << '\n';
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
