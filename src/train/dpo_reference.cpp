#include "train/dpo_reference.hpp"

#include <fmt/format.h>

#include <cmath>
#include <exception>
#include <filesystem>

#include "ckpt/checksum.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/timer.hpp"
#include "dist/collectives.hpp"
#include "io/h5/h5.hpp"
#include "train/objectives/dpo_loss.hpp"
#include "train/stop_policy.hpp"

namespace l3::train {

namespace {

constexpr std::string_view kFormat = "llama3-hpc/reference-logps";

template <typename T>
void feed(ckpt::Xxh64Stream& s, std::span<const T> values) {
  s.update(std::as_bytes(values));
}

// The checksum of a table's values as stored: the chosen ones, then the rejected ones.
std::string values_digest(std::span<const double> chosen, std::span<const double> rejected) {
  ckpt::Xxh64Stream s;
  feed<double>(s, chosen);
  feed<double>(s, rejected);
  return fmt::format("{:016x}", s.digest());
}

// Why stored values cannot be log-probabilities of sequences (sums or means of log p <= 0,
// finite), or "".
std::string outside_domain(std::span<const double> values, std::string_view which) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]) || values[i] > 0) {
      return fmt::format("its {} value of pair {} is {}, not a log-probability (finite, <= 0)",
                         which, i, values[i]);
    }
  }
  return {};
}

}  // namespace

nlohmann::json ReferenceKey::to_json() const {
  return {{"data_xxh64", data_xxh64}, {"model_xxh64", model_xxh64}, {"mean", mean}};
}

std::string data_digest(const dist::World& world, const data::DatasetIndex& index) {
  ckpt::Xxh64Stream s;
  feed<char>(s, index.tokenizer_sha256);
  const std::int64_t counts[2] = {index.samples(), index.vocab_size};
  feed<std::int64_t>(s, counts);
  // The content (tokens, masks, offsets, margins) of every shard, in order: relabelled or
  // regenerated data of the same shape is other data.
  for (const std::string& digest : data::shard_content_digests(world, index)) {
    feed<char>(s, digest);
    feed<char>(s, "\n");
  }
  feed<std::int32_t>(s, index.shard);
  feed<std::int64_t>(s, index.offset);
  feed<std::int32_t>(s, index.length);
  feed<std::int64_t>(s, index.rejected_offset);
  feed<std::int32_t>(s, index.rejected_length);
  return fmt::format("{:016x}", s.digest());
}

ReferenceTable::ReferenceTable(ReferenceKey key, std::vector<double> chosen,
                               std::vector<double> rejected)
    : key_(std::move(key)), chosen_(std::move(chosen)), rejected_(std::move(rejected)) {}

std::vector<double> ReferenceTable::of(const model::Batch& batch) const {
  const std::size_t pairs = batch.pair_ids.size();
  std::vector<double> out(2 * pairs);
  for (std::size_t p = 0; p < pairs; ++p) {
    const std::int64_t id = batch.pair_ids[p];
    if (id < 0 || static_cast<std::size_t>(id) >= chosen_.size()) {
      throw core::internal_error(
          fmt::format("pair {} has no reference log-probabilities ({} pairs)", id, chosen_.size()));
    }
    out[p] = chosen_[static_cast<std::size_t>(id)];
    out[pairs + p] = rejected_[static_cast<std::size_t>(id)];
  }
  return out;
}

ReferenceTable compute_reference(const dist::World& world, model::LlamaModel& model,
                                 const data::DatasetIndex& index, const data::LoaderConfig& loader,
                                 ReferenceKey key, const std::atomic<bool>* stop) {
  const auto pairs = static_cast<std::size_t>(index.samples());
  // Each pair is computed by one rank; the others leave 0 there, and the sum is exact.
  std::vector<double> values(2 * pairs, 0.0);
  data::DataLoader source(world, index, loader, {0, 0});
  const std::int64_t steps = source.steps_in_epoch(0);
  const model::Batch none = model::Batch::none(loader.plan.seq_len);
  for (std::int64_t s = 0; s < steps; ++s) {
    core::fault_point("dpo.reference", world.rank());
    stop_if_requested(world, stop, "while computing DPO's reference log-probabilities");
    const data::StepData& step = source.next();
    for (const model::Batch& batch : step.micro) {
      // A micro-batch without pairs runs with no rows (ZeRO-3: the other ranks' gathers need
      // this rank).
      const std::vector<double> logps =
          sequence_log_probs(model, batch.pairs() > 0 ? batch : none, key.mean);
      // A context-parallel group computes each pair's values on all its ranks: rank 0 keeps them.
      const std::size_t p_count =
          batch.context_rows.empty() || batch.context_rank == 0 ? batch.pair_ids.size() : 0;
      for (std::size_t p = 0; p < p_count; ++p) {
        const auto id = static_cast<std::size_t>(batch.pair_ids[p]);
        values[id] = logps[p];
        values[pairs + id] = logps[p_count + p];
      }
    }
  }
  dist::all_reduce(world.comm(), std::span(values), dist::ReduceOp::sum,
                   "reference log-probabilities");
  std::vector<double> rejected(values.begin() + static_cast<std::ptrdiff_t>(pairs), values.end());
  values.resize(pairs);
  return {std::move(key), std::move(values), std::move(rejected)};
}

void write_reference(const dist::World& world, const std::string& path, const ReferenceTable& t) {
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      const std::scoped_lock guard(h5::library_lock());
      // The directory was checked by check_reference_directory: a real one, or none yet.
      std::filesystem::create_directory(std::filesystem::path(path).parent_path());
      const std::string temporary = core::temporary_name_for(path);
      {
        const h5::Handle file = h5::create_new_file(temporary);
        h5::write_attribute(file, "format", std::string(kFormat), temporary);
        h5::write_attribute(file, "data_xxh64", t.key().data_xxh64, temporary);
        h5::write_attribute(file, "model_xxh64", t.key().model_xxh64, temporary);
        h5::write_attribute(file, "mean", std::int64_t{t.key().mean ? 1 : 0}, temporary);
        h5::write_dataset<double>(file, "chosen", t.chosen(), temporary);
        h5::write_dataset<double>(file, "rejected", t.rejected(), temporary);
        h5::write_attribute(file, "values_xxh64", values_digest(t.chosen(), t.rejected()),
                            temporary);
        h5::flush_file(file, temporary);
      }
      core::fsync_path(temporary);
      core::rename_path(temporary, path);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
}

std::optional<ReferenceTable> read_reference(const dist::World& world, const std::string& path,
                                             const ReferenceKey& key, std::int64_t pairs,
                                             std::string& why) {
  std::exception_ptr failure;
  std::vector<double> values;
  int found = 0;
  if (world.is_root()) {
    try {
      std::error_code ec;
      if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
        why = "none stored yet";
      } else {
        const std::scoped_lock guard(h5::library_lock());
        const h5::Handle file = h5::open_file_read(path);
        if (h5::read_string_attribute(file, "format", path) != kFormat)
          throw core::bad_input("not a file of reference log-probabilities", {.file = path});
        const ReferenceKey stored{
            .data_xxh64 = h5::read_string_attribute(file, "data_xxh64", path),
            .model_xxh64 = h5::read_string_attribute(file, "model_xxh64", path),
            .mean = h5::read_int_attribute(file, "mean", path) != 0};
        if (stored.data_xxh64 != key.data_xxh64) {
          why = "computed for other data";
        } else if (stored.model_xxh64 != key.model_xxh64) {
          why = "computed with another reference model";
        } else if (stored.mean != key.mean) {
          why = "computed for the other --loss";
        } else {
          values = h5::read_dataset<double>(file, "chosen", path);
          std::vector<double> rejected = h5::read_dataset<double>(file, "rejected", path);
          if (static_cast<std::int64_t>(values.size()) != pairs ||
              rejected.size() != values.size()) {
            throw core::bad_input(
                fmt::format("{} and {} values for {} pairs", values.size(), rejected.size(), pairs),
                {.file = path});
          }
          // Like every stored tensor, the values are checked against their checksum, and
          // against their domain (a table written before checksums were stored has only that).
          const std::string digest = values_digest(values, rejected);
          std::string damage;
          if (h5::has_attribute(file, "values_xxh64", path) &&
              h5::read_string_attribute(file, "values_xxh64", path) != digest) {
            damage = "damaged: its values do not match their checksum";
          } else if (std::string w = outside_domain(values, "chosen"); !w.empty()) {
            damage = "damaged: " + w;
          } else if (std::string r = outside_domain(rejected, "rejected"); !r.empty()) {
            damage = "damaged: " + r;
          }
          if (damage.empty()) {
            values.insert(values.end(), rejected.begin(), rejected.end());
            found = 1;
          } else {
            why = fmt::format("{} ({})", damage, path);
          }
        }
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
  found = dist::broadcast_value(world.comm(), found, 0, "reference found");
  why = dist::broadcast_string(world.comm(), why);
  if (found == 0) return std::nullopt;
  values.resize(2 * static_cast<std::size_t>(pairs));
  dist::broadcast_bytes(world.comm(), values.data(), values.size() * sizeof(double), 0);
  std::vector<double> rejected(values.begin() + pairs, values.end());
  values.resize(static_cast<std::size_t>(pairs));
  return ReferenceTable(key, std::move(values), std::move(rejected));
}

void check_reference_directory(const dist::World& world, const std::string& directory,
                               std::string_view option) {
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      namespace fs = std::filesystem;
      std::error_code ec;
      const fs::file_status status = fs::symlink_status(directory, ec);
      if (fs::is_symlink(status)) {
        throw core::bad_input(
            fmt::format("{}: is a symbolic link; name the directory itself (llama3-hpc never "
                        "writes through a link it did not create)",
                        option),
            {.file = directory});
      }
      if (fs::exists(status) && !fs::is_directory(status)) {
        throw core::bad_input(fmt::format("{}: exists and is not a directory", option),
                              {.file = directory});
      }
      for (const char* name : {"train.h5", "val.h5"}) {
        const fs::path file = fs::path(directory) / name;
        const fs::file_status s = fs::symlink_status(file, ec);
        if (fs::exists(s) && !fs::is_regular_file(s)) {
          throw core::bad_input(
              fmt::format("{}: {} is not a regular file (a link, a directory or a device is "
                          "never read or replaced)",
                          option, name),
              {.file = file.string()});
        }
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
}

}  // namespace l3::train
