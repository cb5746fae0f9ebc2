#include "ckpt/local_checkpoint_writer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <thread>

#include "ckpt/background_write.hpp"
#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checksum.hpp"
#include "ckpt/local_files.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/first_failure.hpp"
#include "core/path_safety.hpp"
#include "core/timer.hpp"
#include "dist/collectives.hpp"
#include "dist/communicator.hpp"
#include "dist/point_to_point.hpp"

namespace l3::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using core::FirstFailure;

constexpr std::int64_t kPieceBytes = std::int64_t{16} << 20;  // per MPI message
constexpr int kCopyTag = 7301;

}  // namespace

std::string local_level_directory(const std::string& pattern, const std::string& node,
                                  const std::string& ckpt_dir) {
  fs::path normal = fs::absolute(ckpt_dir).lexically_normal();
  if (!normal.has_filename()) normal = normal.parent_path();  // "a/" is "a"
  const std::string key = normal.string();
  const std::uint64_t hash = xxh64(std::as_bytes(std::span(key.data(), key.size())));
  return (fs::path(dist::expand_node_pattern(pattern, node)) / ("llama3-hpc." + to_hex(hash)))
      .string();
}

std::vector<std::int64_t> local_steps(const std::string& directory) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(directory, ec)) {
    if (!e.is_directory(ec) || e.is_symlink(ec)) continue;
    if (const auto step = parse_step_dir_name(e.path().filename().string())) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  return steps;
}

void remove_local_steps(const std::string& directory,
                        const std::function<bool(std::int64_t)>& remove) {
  for (const std::int64_t step : local_steps(directory)) {
    if (remove(step)) core::remove_tree(fs::path(directory) / step_dir_name(step));
  }
}

bool prunes_directory(MPI_Comm comm, const std::string& directory) {
  const int rank = dist::comm_rank(comm);
  const std::vector<std::string> all = dist::gather_strings(comm, directory);
  json firsts = json::array();
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto first = std::find(all.begin(), all.end(), all[r]) - all.begin();
    firsts.push_back(first == static_cast<std::ptrdiff_t>(r));
  }
  const json agreed = json::parse(dist::broadcast_string(comm, firsts.dump()));
  return agreed.at(static_cast<std::size_t>(rank)).get<bool>();
}

namespace {

// `name` in the older step's directory `old`, to be written over; "" when there is none.
std::string recycled(const fs::path& old, const std::string& name) {
  return old.empty() ? std::string() : (old / name).string();
}

}  // namespace

struct LocalCheckpointWriter::Impl {
  Impl(const dist::World& w, LocalLevelConfig c)
      : world(w),
        config(std::move(c)),
        comm(w.duplicate_comm()),
        background(config.async && w.thread_level() == MPI_THREAD_MULTIPLE) {
    if (world.thread_level() != MPI_THREAD_MULTIPLE) config.async = false;
    pruner = prunes_directory(comm.get(), config.directory);
    if (config.plan.kind == Redundancy::xor_parity) {
      const auto me = static_cast<std::size_t>(world.rank());
      set_comm = dist::split(comm.get(), config.plan.set_of[me], config.plan.position_in_set[me],
                             "XOR sets");
    }
  }

  void settle() const {
    if (config.async) dist::quiet_barrier(comm.get());
  }

  // The partner exchange: this rank's state to its holder, its source's state from it.
  std::int64_t exchange_copies(const StateImage& image, const fs::path& dir, const fs::path& old,
                               FirstFailure& f) const {
    const auto me = static_cast<std::size_t>(world.rank());
    const int holder = config.plan.copy_holder[me];
    const int source = config.plan.copy_source[me];
    const std::int64_t mine = image.size();
    const std::int64_t theirs =
        dist::send_receive_value(comm.get(), mine, holder, source, kCopyTag, "local copy sizes");
    std::unique_ptr<LocalFileWriter> out;
    f.run([&] {
      const std::string name = local_file_name(LocalFileKind::copy, source);
      out = std::make_unique<LocalFileWriter>((dir / name).string(), recycled(old, name));
    });
    std::vector<std::byte> send(
        static_cast<std::size_t>(std::min(kPieceBytes, std::max<std::int64_t>(mine, 1))));
    std::vector<std::byte> receive(
        static_cast<std::size_t>(std::min(kPieceBytes, std::max<std::int64_t>(theirs, 1))));
    for (std::int64_t at = 0; at < std::max(mine, theirs); at += kPieceBytes) {
      const auto out_n =
          static_cast<std::size_t>(std::clamp<std::int64_t>(mine - at, 0, kPieceBytes));
      const auto in_n =
          static_cast<std::size_t>(std::clamp<std::int64_t>(theirs - at, 0, kPieceBytes));
      const std::span<std::byte> outgoing(send.data(), out_n);
      const std::span<std::byte> incoming(receive.data(), in_n);
      if (out_n > 0) image.copy(at, outgoing);
      dist::send_receive(comm.get(), outgoing, holder, incoming, source, kCopyTag, "local copy");
      if (in_n > 0 && out) f.run([&] { out->write_at(at, incoming); });
    }
    if (out)
      f.run([&] {
        out->truncate(theirs);
        out->commit();
      });
    return theirs;
  }

  // XOR parity over this rank's set (ckpt/local_redundancy.hpp): a reduce-scatter of every
  // member's chunks with bitwise XOR, in pieces, into this rank's segment.
  std::int64_t exchange_parity(const StateImage& image, const fs::path& dir, const fs::path& old,
                               std::int64_t step, FirstFailure& f) const {
    const auto me = static_cast<std::size_t>(world.rank());
    const std::vector<int>& members =
        config.plan.sets[static_cast<std::size_t>(config.plan.set_of[me])];
    const int g = static_cast<int>(members.size());
    const int p = config.plan.position_in_set[me];
    const std::vector<std::int64_t> lengths =
        dist::all_gather(set_comm.get(), image.size(), "XOR set sizes");
    const std::int64_t chunk =
        xor_chunk_bytes(*std::max_element(lengths.begin(), lengths.end()), g);
    const json header = {{"format", "llama3-hpc/local-parity"},
                         {"version", 1},
                         {"step", step},
                         {"rank", world.rank()},
                         {"world_size", world.size()},
                         {"node", config.node},
                         {"set", members},
                         {"position", p},
                         {"lengths", lengths},
                         {"chunk", chunk},
                         {"run_key", config.run_key}};
    std::unique_ptr<ParityFileWriter> out;
    f.run([&] {
      const std::string name = local_file_name(LocalFileKind::parity, world.rank());
      out = std::make_unique<ParityFileWriter>((dir / name).string(), header, recycled(old, name));
    });
    // Pieces of each block: a multiple of 8 bytes (chunks are), all G blocks within kPieceBytes;
    // XORed as 64-bit words.
    const std::int64_t piece = std::min(chunk, std::max<std::int64_t>(8, kPieceBytes / g / 8 * 8));
    std::vector<std::uint64_t> send(static_cast<std::size_t>(piece / 8 * g));
    std::vector<std::uint64_t> segment(static_cast<std::size_t>(piece / 8));
    for (std::int64_t at = 0; at < chunk; at += piece) {
      const std::int64_t n = std::min(piece, chunk - at);
      const auto words = static_cast<std::size_t>(n / 8);
      const std::span<std::byte> blocks = std::as_writable_bytes(std::span(send));
      for (int k = 0; k < g; ++k) {
        const std::span<std::byte> block =
            blocks.subspan(static_cast<std::size_t>(k * n), static_cast<std::size_t>(n));
        if (k == p) {
          std::fill(block.begin(), block.end(), std::byte{0});
        } else {
          image.copy(xor_chunk(p, k, g) * chunk + at, block);
        }
      }
      const std::span<std::uint64_t> mine(segment.data(), words);
      dist::reduce_scatter_block(set_comm.get(), std::span(send).first(words * g), mine,
                                 dist::ReduceOp::bitwise_xor, "XOR parity");
      if (out) f.run([&] { out->append(std::as_bytes(mine)); });
    }
    if (out) f.run([&] { out->commit(); });
    return chunk;
  }

  LocalWriteReport run(const model::ParameterLayout& layout, const Manifest& manifest,
                       const RankState& state, CheckpointWriter* flush,
                       const std::vector<model::FlatRange>& flush_ranges,
                       const core::Stopwatch& started) {
    const int rank = world.rank();
    LocalWriteReport out;
    out.step = manifest.step;
    const fs::path dir = fs::path(config.directory) / step_dir_name(manifest.step);
    // With two complete steps, the older one's files are written over (LocalFileWriter): at
    // most two steps are ever on the node, the newest complete one always among them.
    fs::path old;
    if (completed.size() == 2 && completed.front() != manifest.step) {
      old = fs::path(config.directory) / step_dir_name(completed.front());
      completed.pop_front();
    }
    FirstFailure f;
    const core::Stopwatch phase;
    const StateImage image(layout, manifest, state, rank, world.size(), config.node);
    std::int64_t bytes = 0;
    f.run([&] {
      core::make_real_directory(dir, "--ckpt-local");
      core::fault_point("ckpt.local.write", rank);
      const std::string name = local_file_name(LocalFileKind::state, rank);
      image.write_file((dir / name).string(), recycled(old, name));
      bytes += image.size();
    });
    out.state_seconds = phase.seconds();
    settle();
    const core::Stopwatch exchange;
    if (config.plan.kind == Redundancy::partner) bytes += exchange_copies(image, dir, old, f);
    if (config.plan.kind == Redundancy::xor_parity)
      bytes += exchange_parity(image, dir, old, manifest.step, f);
    out.redundancy_seconds = exchange.seconds();
    core::fault_point("ckpt.local.exchanged", rank);

    // Agreement: the step is complete on every rank, or the first failure is everyone's.
    settle();
    const std::vector<std::string> failures = dist::gather_strings(comm.get(), f.text);
    std::string first;
    for (const std::string& text : failures) {
      if (!text.empty()) {
        first = text;
        break;
      }
    }
    out.failure = dist::broadcast_string(comm.get(), first);
    out.bytes = dist::all_reduce(comm.get(), bytes, dist::ReduceOp::sum, "local bytes");
    if (out.failure.empty()) {
      complete(manifest.step);
      core::fault_point("ckpt.local.complete", rank);
    }
    out.seconds = started.seconds();
    if (flush != nullptr) {
      Manifest copy = manifest;
      out.flushed =
          flush_ranges == state.ranges
              ? flush->write_here(layout, std::move(copy), state)
              : flush->write_here(layout, std::move(copy), restrict_state(state, flush_ranges));
    }
    return out;
  }

  // `step` is complete: keep it and the one before, remove the others (the pruning rank of
  // each directory; a removal that fails is retried next time).
  void complete(std::int64_t step) {
    if (completed.empty() || completed.back() != step) completed.push_back(step);
    while (completed.size() > 2) completed.pop_front();
    if (!pruner) return;
    try {
      remove_local_steps(config.directory, [&](std::int64_t s) {
        return std::find(completed.begin(), completed.end(), s) == completed.end();
      });
    } catch (const core::Error&) {  // NOLINT(bugprone-empty-catch): retried at the next step
    }
  }

  const dist::World& world;
  LocalLevelConfig config;
  dist::UniqueComm comm;
  dist::UniqueComm set_comm;
  bool pruner = false;
  std::deque<std::int64_t> completed;  // the newest complete steps, oldest first
  BackgroundWrite<LocalWriteReport> background;
};

LocalCheckpointWriter::LocalCheckpointWriter(const dist::World& world, LocalLevelConfig config)
    : impl_(std::make_unique<Impl>(world, std::move(config))) {}

LocalCheckpointWriter::~LocalCheckpointWriter() = default;

RankState LocalCheckpointWriter::take_spare() { return impl_->background.take_spare(); }
void LocalCheckpointWriter::provide_spare(RankState spare) {
  impl_->background.provide_spare(std::move(spare));
}
bool LocalCheckpointWriter::busy() const noexcept { return impl_->background.busy(); }
bool LocalCheckpointWriter::ready() const noexcept { return impl_->background.ready(); }

void LocalCheckpointWriter::resumed_at(std::int64_t step) {
  impl_->completed.clear();
  impl_->completed.push_back(step);
}

std::optional<LocalWriteReport> LocalCheckpointWriter::wait() { return impl_->background.wait(); }

void LocalCheckpointWriter::write(const model::ParameterLayout& layout, Manifest manifest,
                                  RankState state, CheckpointWriter* flush,
                                  std::vector<model::FlatRange> flush_ranges) {
  (void)wait();
  Impl& s = *impl_;
  s.background.start(
      [&s, layout, manifest = std::move(manifest), flush, flush_ranges = std::move(flush_ranges),
       started = core::Stopwatch()](const RankState& snapshot) {
        return s.run(layout, manifest, snapshot, flush, flush_ranges, started);
      },
      std::move(state));
}

}  // namespace l3::ckpt
