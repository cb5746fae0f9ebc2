#include "ckpt/checkpoint_writer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>

#include "ckpt/background_write.hpp"
#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checksum.hpp"
#include "ckpt/tensor_file.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/path_safety.hpp"
#include "core/timer.hpp"
#include "dist/collectives.hpp"
#include "dist/communicator.hpp"

namespace l3::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<DatasetSpec> model_datasets(const model::ParameterLayout& layout) {
  std::vector<DatasetSpec> sets;
  for (const model::TensorInfo& t : layout.tensors()) sets.push_back({t.name, t.shape});
  return sets;
}

std::vector<DatasetSpec> optim_datasets(const model::ParameterLayout& layout) {
  std::vector<DatasetSpec> sets;
  for (const char* group : {"exp_avg", "exp_avg_sq"}) {
    for (const model::TensorInfo& t : layout.tensors())
      sets.push_back({fmt::format("{}/{}", group, t.name), t.shape});
  }
  return sets;
}

std::uint64_t hash_of(std::span<const float> values) { return xxh64(std::as_bytes(values)); }

// The complete checkpoints under root, newest first: real directories whose manifest reads
// and is of the step the directory is named for. The others, with the reason, in `ignored`:
// a copy or a rename under another step's name is no checkpoint of that step, and counting it
// would push a real one out.
std::vector<std::string> complete_checkpoints(const std::string& root,
                                              std::vector<std::string>& ignored) {
  std::vector<std::string> found = step_directories(root);
  std::erase_if(found, [&](const std::string& name) {
    const fs::path dir = fs::path(root) / name;
    if (!core::is_real_directory(dir)) return true;
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(dir / kManifestFile, ec))) return true;  // incomplete
    try {
      (void)read_manifest(dir.string());
      return false;
    } catch (const core::Error& e) {
      ignored.push_back(fmt::format("{}: {} (left as it is)", name, e.message()));
      return true;
    }
  });
  return found;
}

// Whether a stale directory of the writer's (step-N.partial, step-N.replaced) holds only what
// the writer puts there: then it is ours to remove; anything else is left alone.
bool holds_only_checkpoint_files(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool regular = it->symlink_status(ec).type() == fs::file_type::regular;
    const bool known = name == kModelFile || name == kOptimFile || name == kManifestFile ||
                       name == "why-damaged.txt" || core::is_temporary_name(name);
    if (!regular || !known) return false;
  }
  return !ec;
}

}  // namespace

PruneReport prune_checkpoints(const std::string& root, int keep_last, PartialDirectories partial,
                              const CheckpointCheck& check) {
  keep_last = std::max(keep_last, 2);
  PruneReport report;
  const auto remove = [&](const std::string& name) {
    try {
      core::remove_tree(fs::path(root) / name);
      report.removed.push_back(name);
    } catch (const core::Error& e) {
      report.failed.push_back(fmt::format("{}: {}", name, e.message()));
    }
  };
  std::string latest;
  try {
    latest = read_latest(root);
  } catch (const core::Error& e) {  // unreadable: no checkpoint is protected by it, none pruned
    report.failed.push_back(e.what());
    return report;
  }
  const auto complete = complete_checkpoints(root, report.ignored);
  std::size_t good = 0;
  for (const std::string& name : complete) {
    if (good < static_cast<std::size_t>(keep_last)) {
      const std::string damaged = check ? check((fs::path(root) / name).string()) : "";
      if (damaged.empty()) {
        ++good;
      } else {
        report.ignored.push_back(
            fmt::format("{}: DAMAGED: {} (left as it is, not counted)", name, damaged));
      }
      continue;
    }
    if (name != latest) remove(name);
  }
  if (partial == PartialDirectories::keep) return report;
  std::vector<std::string> stale;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const fs::file_type type = e.symlink_status(ec).type();
    const bool step = parse_step_dir_name(name.substr(0, name.find('.'))).has_value();
    if ((type == fs::file_type::directory && step &&
         (name.ends_with(kPartialSuffix) || name.ends_with(".replaced")) &&
         holds_only_checkpoint_files(e.path())) ||
        (type == fs::file_type::regular && name.starts_with(kLatestFile) &&
         core::is_temporary_name(name)))
      stale.push_back(name);
  }
  for (const std::string& name : stale) remove(name);
  return report;
}

struct CheckpointWriter::Impl {
  Impl(const dist::World& w, std::string r, WriterPolicy p)
      : world(w),
        root(std::move(r)),
        policy(p),
        comm(w.duplicate_comm()),
        background(p.async && w.thread_level() == MPI_THREAD_MULTIPLE) {
    policy.keep_last = std::max(policy.keep_last, 2);
    if (world.thread_level() != MPI_THREAD_MULTIPLE) policy.async = false;
  }

  // The whole protocol for one checkpoint; the same outcome on every rank.
  WriteReport run(const model::ParameterLayout& layout, Manifest& manifest, const RankState& state,
                  const core::Stopwatch& started) const {
    const int rank = world.rank();
    const std::string name = step_dir_name(manifest.step);
    const fs::path partial = fs::path(root) / (name + std::string(kPartialSuffix));
    const std::string model_path = (partial / kModelFile).string();
    const std::string optim_path = (partial / kOptimFile).string();
    const std::vector<DatasetSpec> model_sets = model_datasets(layout);
    const std::vector<DatasetSpec> optim_sets = optim_datasets(layout);

    // 1. Rank 0 creates the files.
    std::string failure;
    std::vector<std::int64_t> offsets;
    if (rank == 0) {
      try {
        fs::create_directories(root);
        core::remove_tree(partial);  // a stale one of ours (a link: removed, not followed)
        if (!fs::create_directory(partial))
          throw core::internal_error("exists already", {.file = partial.string()});
        offsets = create_tensor_file(
            model_path, model_sets,
            {{{"format", "llama3-hpc/model"}, {"head", std::string(head_name(layout.head()))}},
             {{"version", 1}}});
        const std::vector<std::int64_t> optim =
            create_tensor_file(optim_path, optim_sets,
                               {{{"format", "llama3-hpc/optimizer"}},
                                {{"version", 1}, {"adamw_step", manifest.adamw_step}}});
        offsets.insert(offsets.end(), optim.begin(), optim.end());
      } catch (...) {
        failure =
            fmt::format("checkpoint {}: {}", name, core::summarize(std::current_exception()).text);
      }
    }
    settle();
    failure = dist::broadcast_string(comm.get(), failure);
    if (!failure.empty()) throw core::internal_error(failure);
    dist::broadcast_vector(comm.get(), offsets);

    // 2. Every rank writes and checksums its slices.
    json mine = {{"error", ""}, {"slices", json::array()}, {"bytes", 0}};
    try {
      // A block of evenly spaced runs (a tensor-parallel rank's columns of a row-parallel
      // weight) is one slice: its values lie back to back in the state, hashed as one.
      const std::vector<TensorBlock> blocks = tensor_blocks(layout, state.ranges);
      RawFileWriter model_file(model_path);
      RawFileWriter optim_file(optim_path);
      const std::size_t tensors = layout.tensors().size();
      std::int64_t bytes = 0;
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        if (i == blocks.size() / 2) core::fault_point("ckpt.write", rank);  // half written
        const TensorBlock& b = blocks[i];
        const auto at = static_cast<std::size_t>(b.position);
        const auto n = static_cast<std::size_t>(b.values());
        const std::span<const float> master(state.master.data() + at, n);
        const std::span<const float> m(state.exp_avg.data() + at, n);
        const std::span<const float> v(state.exp_avg_sq.data() + at, n);
        const auto run = static_cast<std::size_t>(b.count);
        for (std::int64_t r = 0; r < b.rows; ++r) {
          const std::int64_t first = b.first + r * b.stride;
          const auto from = static_cast<std::size_t>(r) * run;
          model_file.write(offsets[b.tensor], first, master.subspan(from, run));
          optim_file.write(offsets[tensors + b.tensor], first, m.subspan(from, run));
          optim_file.write(offsets[2 * tensors + b.tensor], first, v.subspan(from, run));
        }
        json slice = {b.tensor,           b.first,           b.count, to_hex(hash_of(master)),
                      to_hex(hash_of(m)), to_hex(hash_of(v))};
        if (b.rows > 1) {
          slice.push_back(b.rows);
          slice.push_back(b.stride);
        }
        mine["slices"].push_back(std::move(slice));
        bytes += 3 * b.values() * static_cast<std::int64_t>(sizeof(float));
      }
      model_file.sync();
      optim_file.sync();
      mine["bytes"] = bytes;
    } catch (...) {
      mine["error"] =
          fmt::format("rank {}: {}", rank, core::summarize(std::current_exception()).text);
    }
    settle();
    const std::vector<std::string> reports = dist::gather_strings(comm.get(), mine.dump());

    // 3. Rank 0 commits.
    std::int64_t total_bytes = 0;
    if (rank == 0) {
      try {
        json table = json::array();
        for (const model::TensorInfo& t : layout.tensors())
          table.push_back({{"name", t.name}, {"shape", t.shape}, {"slices", json::array()}});
        for (const std::string& text : reports) {
          const json r = json::parse(text);
          if (!r.at("error").get<std::string>().empty()) {
            throw core::internal_error(r.at("error").get<std::string>());
          }
          total_bytes += r.at("bytes").get<std::int64_t>();
          for (const json& s : r.at("slices")) {
            json slice = {s[1], s[2], s[3], s[4], s[5]};
            if (s.size() > 6) {  // a block: its rows and stride
              slice.push_back(s[6]);
              slice.push_back(s[7]);
            }
            table[s[0].get<std::size_t>()]["slices"].push_back(std::move(slice));
          }
        }
        for (json& t : table) {
          std::sort(t["slices"].begin(), t["slices"].end(),
                    [](const json& a, const json& b) { return a[0] < b[0]; });
        }
        manifest.tensors = std::move(table);
        manifest.files = {{std::string(kModelFile), {{"bytes", fs::file_size(model_path)}}},
                          {std::string(kOptimFile), {{"bytes", fs::file_size(optim_path)}}}};
        core::write_file_atomically((partial / kManifestFile).string(),
                                    manifest.to_json().dump(1) + "\n");
        core::fault_point("ckpt.before_rename", rank);
        core::fsync_path(partial.string());
        const fs::path final_dir = fs::path(root) / name;
        const fs::path replaced = fs::path(root) / (name + ".replaced");
        const bool replacing = core::entry_exists(final_dir);
        if (replacing) {
          core::remove_tree(replaced);
          core::rename_path(final_dir.string(), replaced.string());
        }
        core::rename_path(partial.string(), final_dir.string());
        core::fsync_path(root);
        core::fault_point("ckpt.before_latest", rank);
        core::write_file_atomically((fs::path(root) / kLatestFile).string(), name + "\n",
                                    [rank] { core::fault_point("ckpt.latest", rank); });
        if (replacing) core::remove_tree(replaced);
        (void)prune_checkpoints(root, policy.keep_last, PartialDirectories::remove);
      } catch (...) {
        failure = fmt::format("checkpoint {} not written: {}", name,
                              core::summarize(std::current_exception()).text);
      }
    }
    settle();
    failure = dist::broadcast_string(comm.get(), failure);
    if (!failure.empty()) throw core::internal_error(failure);
    dist::broadcast_bytes(comm.get(), &total_bytes, sizeof(total_bytes), 0);
    return {(fs::path(root) / name).string(), started.seconds(), total_bytes};
  }

  // On the background thread, the ranks meet without busy-polling before each collective:
  // those finishing first would otherwise spin a core that the training needs.
  void settle() const {
    if (policy.async) dist::quiet_barrier(comm.get());
  }

  const dist::World& world;
  std::string root;
  WriterPolicy policy;
  dist::UniqueComm comm;
  BackgroundWrite<WriteReport> background;
};

CheckpointWriter::CheckpointWriter(const dist::World& world, std::string root, WriterPolicy policy)
    : impl_(std::make_unique<Impl>(world, std::move(root), policy)) {}

CheckpointWriter::~CheckpointWriter() = default;

RankState CheckpointWriter::take_spare() { return impl_->background.take_spare(); }
void CheckpointWriter::provide_spare(RankState spare) {
  impl_->background.provide_spare(std::move(spare));
}
bool CheckpointWriter::busy() const noexcept { return impl_->background.busy(); }
bool CheckpointWriter::ready() const noexcept { return impl_->background.ready(); }
const std::string& CheckpointWriter::root() const noexcept { return impl_->root; }

std::optional<WriteReport> CheckpointWriter::wait() { return impl_->background.wait(); }

WriteReport CheckpointWriter::write_here(const model::ParameterLayout& layout, Manifest manifest,
                                         const RankState& state) {
  if (busy()) throw core::internal_error("CheckpointWriter::write_here with a write in flight");
  return impl_->run(layout, manifest, state, core::Stopwatch());
}

void CheckpointWriter::write(const model::ParameterLayout& layout, Manifest manifest,
                             RankState state) {
  (void)wait();
  Impl& s = *impl_;
  s.background.start(
      [&s, layout, manifest = std::move(manifest), started = core::Stopwatch()](
          const RankState& snapshot) mutable { return s.run(layout, manifest, snapshot, started); },
      std::move(state));
}

}  // namespace l3::ckpt
