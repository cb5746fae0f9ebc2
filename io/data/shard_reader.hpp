// Rank-parallel reading of shard token ranges. Every shard is opened once, collectively, through
// HDF5's MPI-IO driver with collective metadata reads (one rank reads the file metadata and
// shares it: no metadata storm), file locking off unless asked for; the handles stay open.
// After that each rank reads only its own ranges: per shard and field, one H5Dread of the union
// of the requested hyperslabs (adjacent ranges coalesce), independent by default or as a
// collective transfer (every rank then calls for the same shards in the same order, with an
// empty selection where it has nothing).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dist/world.hpp"
#include "io/data/dataset_index.hpp"

namespace l3::data {

struct ReaderOptions {
  bool collective_transfers = false;
  bool file_locking = false;
  // Preference: read the responses' masks too (DPO; every shard must have them).
  bool response_masks = false;
};

enum class Field : std::uint8_t {
  tokens,
  loss_mask,
  chosen_tokens,
  rejected_tokens,
  chosen_mask,
  rejected_mask
};

struct ReadRequest {
  std::int32_t shard = 0;
  Field field = Field::tokens;
  std::int64_t offset = 0;  // elements
  std::int64_t count = 0;
  void* out = nullptr;  // count elements: uint32 for tokens, uint8 for masks
};

class ShardReader {
 public:
  // Collective over `world`: opens every shard of the index.
  ShardReader(const dist::World& world, const DatasetIndex& index, ReaderOptions options);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;
  ShardReader(ShardReader&&) = delete;
  ShardReader& operator=(ShardReader&&) = delete;

  // Fills every request. Independent transfers: local. Collective transfers: collective, and
  // `shards_any_rank` (sorted) lists every shard any rank reads in this call.
  void read(std::vector<ReadRequest> requests, std::span<const std::int32_t> shards_any_rank);

  [[nodiscard]] bool collective() const noexcept { return options_.collective_transfers; }

 private:
  struct OpenShard;
  void read_group(OpenShard& shard, Field field, std::span<const ReadRequest> requests) const;

  const DatasetIndex& index_;
  ReaderOptions options_;
  MPI_Comm comm_;  // the world's: opening and closing the shards are collective over it
  std::vector<std::unique_ptr<OpenShard>> shards_;
};

}  // namespace l3::data
