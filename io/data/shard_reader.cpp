#include "io/data/shard_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "core/error.hpp"
#include "core/input_file.hpp"
#include "dist/wait_policy.hpp"
#include "io/h5/h5.hpp"

namespace l3::data {

struct ShardReader::OpenShard {
  std::string path;
  h5::Handle file;
  h5::Handle tokens;                      // /tokens or /chosen/tokens
  h5::Handle loss_mask;                   // SFT
  h5::Handle rejected;                    // /rejected/tokens
  h5::Handle chosen_mask, rejected_mask;  // preference, for DPO
};

namespace {

h5::Handle open_dataset(const h5::Handle& file, const char* name, const std::string& path) {
  h5::Handle set(H5Dopen2(file.get(), name, H5P_DEFAULT), H5Dclose);
  if (!set.valid()) throw core::bad_input("missing dataset", {.file = path, .tensor = name});
  return set;
}

}  // namespace

ShardReader::ShardReader(const dist::World& world, const DatasetIndex& index, ReaderOptions options)
    : index_(index), options_(options), comm_(world.comm()) {
  h5::quiet_errors();
  const std::scoped_lock guard(h5::library_lock());
  const h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // The file's own communicator is a duplicate HDF5 makes of the one given here.
  H5Pset_fapl_mpio(fapl.get(), world.comm(), MPI_INFO_NULL);
  H5Pset_all_coll_metadata_ops(fapl.get(), true);
  H5Pset_file_locking(fapl.get(), options.file_locking, true);
  for (const ShardEntry& entry : index.shards) {
    auto shard = std::make_unique<OpenShard>();
    shard->path = entry.path;
    core::require_regular_file(entry.path, "a dataset shard");
    // HDF5's collective open is a dozen MPI calls that spin; ranks sharing cores arrive first.
    dist::arrive_quietly(comm_, "opening a dataset shard");
    shard->file = h5::Handle(H5Fopen(entry.path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
    if (!shard->file.valid())
      throw core::bad_input("cannot open with the MPI-IO driver", {.file = entry.path});
    if (index.kind == SampleKind::sft) {
      shard->tokens = open_dataset(shard->file, "tokens", entry.path);
      shard->loss_mask = open_dataset(shard->file, "loss_mask", entry.path);
    } else {
      shard->tokens = open_dataset(shard->file, "chosen/tokens", entry.path);
      shard->rejected = open_dataset(shard->file, "rejected/tokens", entry.path);
      if (options.response_masks) {
        shard->chosen_mask = open_dataset(shard->file, "chosen/loss_mask", entry.path);
        shard->rejected_mask = open_dataset(shard->file, "rejected/loss_mask", entry.path);
      }
    }
    shards_.push_back(std::move(shard));
  }
}

ShardReader::~ShardReader() {
  const std::scoped_lock guard(h5::library_lock());
  if (std::uncaught_exceptions() > 0) {
    // Unwinding after an error on this rank while the others may be anywhere (mid-step, in a
    // collective): closing an MPI-IO file is collective, so it would wait for them forever instead
    // of reaching the error agreement that reports the error or aborts the job (cli::conclude_run).
    // Leave the shards open; MPI_Abort, or HDF5's shutdown in MPI_Finalize, ends them.
    for (const auto& shard : shards_) {
      shard->tokens.release();
      shard->loss_mask.release();
      shard->rejected.release();
      shard->chosen_mask.release();
      shard->rejected_mask.release();
      shard->file.release();
    }
    return;
  }
  try {
    dist::arrive_quietly(comm_, "closing the dataset shards");
  } catch (...) {  // MPI failing here fails the close below as well, which reports it
  }
  shards_.clear();  // closes datasets, then files (collective with the MPI-IO driver)
}

void ShardReader::read_group(OpenShard& shard, Field field,
                             std::span<const ReadRequest> requests) const {
  const h5::Handle* set = &shard.tokens;
  const char* name = "tokens";
  switch (field) {
    case Field::tokens:
    case Field::chosen_tokens:
      break;
    case Field::loss_mask:
      set = &shard.loss_mask, name = "loss_mask";
      break;
    case Field::rejected_tokens:
      set = &shard.rejected, name = "rejected/tokens";
      break;
    case Field::chosen_mask:
      set = &shard.chosen_mask, name = "chosen/loss_mask";
      break;
    case Field::rejected_mask:
      set = &shard.rejected_mask, name = "rejected/loss_mask";
      break;
  }
  const bool mask_field =
      field == Field::loss_mask || field == Field::chosen_mask || field == Field::rejected_mask;
  const hid_t memory_type = mask_field ? H5T_NATIVE_UINT8 : H5T_NATIVE_UINT32;
  const std::size_t element = mask_field ? 1 : 4;

  // The union of the ranges (sorted, none overlapping), read into one buffer in file order.
  std::int64_t total = 0;
  const h5::Handle file_space(H5Dget_space(set->get()), H5Sclose);
  H5Sselect_none(file_space.get());
  std::int64_t previous_end = -1;
  for (const ReadRequest& r : requests) {
    if (r.offset < previous_end) {
      throw core::internal_error(fmt::format("overlapping reads at {} of {}", r.offset, name),
                                 {.file = shard.path});
    }
    previous_end = r.offset + r.count;
    if (r.count == 0) continue;
    const hsize_t start[1] = {static_cast<hsize_t>(r.offset)};
    const hsize_t count[1] = {static_cast<hsize_t>(r.count)};
    if (H5Sselect_hyperslab(file_space.get(), H5S_SELECT_OR, start, nullptr, count, nullptr) < 0) {
      throw core::bad_input(fmt::format("cannot select [{}, {})", r.offset, r.offset + r.count),
                            {.file = shard.path, .tensor = name});
    }
    total += r.count;
  }
  std::vector<std::byte> buffer(static_cast<std::size_t>(std::max<std::int64_t>(total, 1)) *
                                element);
  const hsize_t memory_count[1] = {static_cast<hsize_t>(std::max<std::int64_t>(total, 1))};
  const h5::Handle memory_space(H5Screate_simple(1, memory_count, nullptr), H5Sclose);
  if (total == 0) H5Sselect_none(memory_space.get());
  const h5::Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(dxpl.get(),
                   options_.collective_transfers ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
  if (H5Dread(set->get(), memory_type, memory_space.get(), file_space.get(), dxpl.get(),
              buffer.data()) < 0) {
    throw core::bad_input(
        fmt::format("cannot read {} elements (truncated or corrupt shard?)", total),
        {.file = shard.path, .tensor = name});
  }
  std::size_t at = 0;
  for (const ReadRequest& r : requests) {
    const std::size_t bytes = static_cast<std::size_t>(r.count) * element;
    if (bytes > 0) std::memcpy(r.out, buffer.data() + at, bytes);
    at += bytes;
  }
}

void ShardReader::read(std::vector<ReadRequest> requests,
                       std::span<const std::int32_t> shards_any_rank) {
  std::sort(requests.begin(), requests.end(), [](const ReadRequest& a, const ReadRequest& b) {
    return std::tie(a.shard, a.field, a.offset) < std::tie(b.shard, b.field, b.offset);
  });
  const std::scoped_lock guard(h5::library_lock());
  std::vector<Field> fields =
      index_.kind == SampleKind::sft
          ? std::vector<Field>{Field::tokens, Field::loss_mask}
          : std::vector<Field>{Field::chosen_tokens, Field::rejected_tokens};
  if (index_.kind == SampleKind::preference && options_.response_masks) {
    fields.push_back(Field::chosen_mask);
    fields.push_back(Field::rejected_mask);
  }
  auto group_of = [&](std::int32_t shard, Field field) {
    const auto lo =
        std::lower_bound(requests.begin(), requests.end(), std::pair{shard, field},
                         [](const ReadRequest& r, const std::pair<std::int32_t, Field>& k) {
                           return std::tie(r.shard, r.field) < std::tie(k.first, k.second);
                         });
    auto hi = lo;
    while (hi != requests.end() && hi->shard == shard && hi->field == field) ++hi;
    return std::span<const ReadRequest>(requests).subspan(
        static_cast<std::size_t>(lo - requests.begin()), static_cast<std::size_t>(hi - lo));
  };
  if (options_.collective_transfers) {
    for (const std::int32_t shard : shards_any_rank) {  // the same sequence on every rank
      for (const Field f : fields)
        read_group(*shards_[static_cast<std::size_t>(shard)], f, group_of(shard, f));
    }
    return;
  }
  for (std::size_t i = 0; i < requests.size();) {
    std::size_t j = i;
    while (j < requests.size() && requests[j].shard == requests[i].shard &&
           requests[j].field == requests[i].field)
      ++j;
    read_group(*shards_[static_cast<std::size_t>(requests[i].shard)], requests[i].field,
               std::span<const ReadRequest>(requests.data() + i, j - i));
    i = j;
  }
}

}  // namespace l3::data
