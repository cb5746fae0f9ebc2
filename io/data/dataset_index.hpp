// A dataset directory (index.json + shards) as every rank sees it: where each sample lives and
// how long it is. Rank 0 alone reads index.json and each shard's attributes and offsets,
// validates everything, and broadcasts compact arrays, so that the ranks of a big job never all
// hit the file system's metadata at once.
//
// Samples are numbered in index order (shards in index.json order, documents in shard order).
// An SFT sample is a document; a preference sample is a pair (document p of both groups).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/world.hpp"

namespace l3::data {

// prompt: GRPO's prompts with their records (shard_format.hpp), a sample per prompt.
enum class SampleKind { sft, preference, prompt };

struct ShardEntry {
  std::string path;  // absolute
  std::int64_t first_sample = 0;
  std::int64_t samples = 0;
  bool has_margin = false;
  // Preference: /chosen/loss_mask and /rejected/loss_mask (the responses' tokens; what DPO
  // counts), written by prep since DPO came.
  bool has_response_masks = false;
  // data::content_digest of the shard as prep recorded it in index.json; "" for a dataset
  // prepared before prep recorded it (shard_content_digests computes it then).
  std::string content_xxh64;
};

struct DatasetIndex {
  std::string directory;
  SampleKind kind = SampleKind::sft;
  std::string tokenizer_sha256;
  std::string tokenizer_name;  // what prep loaded: "bytes" or the tokenizer's path
  std::int64_t vocab_size = 0;
  std::vector<ShardEntry> shards;
  // Per sample. For preference samples, `offset`/`length` are the chosen sequence.
  std::vector<std::int32_t> shard;
  std::vector<std::int64_t> offset;
  std::vector<std::int32_t> length;
  std::vector<std::int64_t> rejected_offset;  // preference only
  std::vector<std::int32_t> rejected_length;  // preference only
  std::vector<float> margin;                  // preference only: /margin, or 0

  [[nodiscard]] std::int64_t samples() const noexcept {
    return static_cast<std::int64_t>(shard.size());
  }
  // Tokens the sample occupies in a row (a pair: both sequences).
  [[nodiscard]] std::int64_t sample_tokens(std::int64_t sample) const noexcept;
  [[nodiscard]] std::int64_t total_tokens() const noexcept;
  [[nodiscard]] bool has_margin() const noexcept;
  // Every shard has its pairs' response masks.
  [[nodiscard]] bool has_response_masks() const noexcept;
};

// What the model expects of its data.
struct DatasetExpectations {
  SampleKind kind = SampleKind::sft;
  std::int64_t model_vocab = 0;        // shards with a larger vocabulary are refused
  std::string model_tokenizer_sha256;  // empty: the model carries no tokenizer, not checked
  bool ignore_tokenizer_mismatch = false;
};

// Collective over `world`. bad_input Errors name the directory or the shard (same on all ranks).
[[nodiscard]] DatasetIndex open_dataset(const dist::World& world, const std::string& directory,
                                        const DatasetExpectations& expect);

// The kind of the dataset at `directory` as its index.json's "format" says (rank 0 reads it,
// every rank gets it); nullopt when it cannot be read or says neither (open_dataset then says
// why). Collective.
[[nodiscard]] std::optional<SampleKind> dataset_kind(const dist::World& world,
                                                     const std::string& directory);

// Every shard's content digest, in shard order: index.json's, or for a shard that has none (an
// earlier prep's) computed by reading it, the ranks sharing the reading. Collective.
[[nodiscard]] std::vector<std::string> shard_content_digests(const dist::World& world,
                                                             const DatasetIndex& index);

}  // namespace l3::data
