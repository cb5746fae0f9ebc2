// `llama3-hpc prep`: JSONL (plain or .gz) -> a dataset directory of HDF5 shards + index.json,
// on any number of MPI ranks. Each rank tokenizes its share of the input (split at line
// boundaries) and writes its own shards; rank 0 writes index.json last. Everything is written
// into a staging directory next to the output and renamed into place only when complete, so
// an interrupted or failed run leaves the output as it was.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "dist/world.hpp"
#include "io/prep/record_format.hpp"

namespace l3::prep {

// prompts: GRPO's prompts, each with its record (docs/FORMAT.md).
enum class DatasetKind { sft, preference, prompts };

struct PrepOptions {
  DatasetKind kind = DatasetKind::sft;
  std::vector<std::string> inputs;  // files or globs
  std::string tokenizer;
  std::string output;
  FormatOptions format;
  std::int64_t shard_tokens = 256'000'000;
  double val_fraction = 0.0;  // > 0: output/train and output/val
  std::uint64_t seed = 1234;  // of the validation split
  bool skip_bad = false;
  bool overwrite = false;
};

struct PrepSummary {
  std::int64_t records = 0;  // non-blank input lines
  std::int64_t kept = 0;
  std::map<std::string, std::int64_t>
      dropped;  // reason -> count (empty, no_targets, too_long, bad)
  std::int64_t train = 0;
  std::int64_t validation = 0;
  std::int64_t tokens = 0;
  std::int64_t loss_tokens = 0;
  std::int64_t shards = 0;
  std::int64_t input_bytes = 0;
  double seconds = 0.0;
};

// Collective over `world`. Returns the totals on rank 0 (each rank's own share elsewhere: only
// seconds is meaningful there).
PrepSummary run_prep(const dist::World& world, const core::Logger& log, const PrepOptions& options);

}  // namespace l3::prep
