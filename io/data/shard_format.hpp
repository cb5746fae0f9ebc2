// The HDF5 shard schema (docs/FORMAT.md), shared by the writer (prep) and the readers.
//
// SFT shard, attributes format="llama3-hpc/sft", version, tokenizer_sha256, vocab_size:
//   /tokens       u32[T]    all documents back to back
//   /loss_mask    u8[T]     1: token t is a training target, predicted from the tokens before it
//   /doc_offsets  i64[D+1]  document d is tokens[doc_offsets[d] : doc_offsets[d+1]]
// Preference shard, format="llama3-hpc/preference": groups /chosen and /rejected, each with
// tokens and doc_offsets (pair p is document p of both), optional /margin f32[P].
// Prompt shard, format="llama3-hpc/prompts" (GRPO's prompts): /tokens and /doc_offsets as SFT's
// (each prompt formatted up to the assistant header), and each prompt's JSON record (its
// original fields: "answer", test cases, ... for the rewards):
//   /records         u8[B]     UTF-8 JSON objects back to back
//   /record_offsets  i64[D+1]  prompt d's record is records[record_offsets[d] : ...[d+1]]
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace l3::data {

inline constexpr std::string_view kSftFormat = "llama3-hpc/sft";
inline constexpr std::string_view kPreferenceFormat = "llama3-hpc/preference";
inline constexpr std::string_view kPromptFormat = "llama3-hpc/prompts";
inline constexpr std::int64_t kShardVersion = 1;

struct ShardAttributes {
  std::string format;
  std::int64_t version = kShardVersion;
  std::string tokenizer_sha256;
  std::int64_t vocab_size = 0;
};

// Documents back to back, with their loss masks (empty for preference groups) and offsets.
struct Documents {
  std::vector<std::uint32_t> tokens;
  std::vector<std::uint8_t> loss_mask;
  std::vector<std::int64_t> offsets{0};

  void add(std::span<const std::int32_t> document, std::span<const std::uint8_t> mask);
  [[nodiscard]] std::int64_t count() const noexcept {
    return static_cast<std::int64_t>(offsets.size()) - 1;
  }
  [[nodiscard]] std::int64_t token_count() const noexcept {
    return static_cast<std::int64_t>(tokens.size());
  }
  [[nodiscard]] std::int64_t loss_tokens() const noexcept;
  void clear();
};

struct PreferencePairs {
  Documents chosen;
  Documents rejected;
  std::vector<float> margins;  // one per pair when any record had a margin, else empty
  bool has_margin = false;

  [[nodiscard]] std::int64_t count() const noexcept { return chosen.count(); }
  void clear();
};

// Prompts (loss masks empty) with their records.
struct Prompts {
  Documents documents;
  std::string records;  // the JSON records back to back
  std::vector<std::int64_t> record_offsets{0};

  void add(std::span<const std::int32_t> prompt, std::string_view record);
  [[nodiscard]] std::int64_t count() const noexcept { return documents.count(); }
  [[nodiscard]] std::string_view record(std::int64_t d) const;
  void clear();
};

// The xxHash64 (16 hex digits) of what a shard holds for training: every array the readers use
// (tokens, loss masks, offsets; margins when present), in a fixed order, with their lengths.
// prep records it for each shard in index.json ("content_xxh64"); tables computed from the
// samples (DPO's reference) are keyed on it, so that other data of the same shape is never
// taken for this data.
[[nodiscard]] std::string content_digest(const Documents& documents);
[[nodiscard]] std::string content_digest(const PreferencePairs& pairs);
[[nodiscard]] std::string content_digest(const Prompts& prompts);

// Write a complete shard to path (under a fresh temporary name created exclusively, fsynced,
// renamed: atomic; core/durable_file.hpp).
void write_sft_shard(const std::string& path, const Documents& documents,
                     const ShardAttributes& attributes);
void write_preference_shard(const std::string& path, const PreferencePairs& pairs,
                            const ShardAttributes& attributes);
void write_prompt_shard(const std::string& path, const Prompts& prompts,
                        const ShardAttributes& attributes);

// Read a whole shard, validating its schema: bad_input Errors name the file and dataset.
struct SftShard {
  ShardAttributes attributes;
  Documents documents;
};
struct PreferenceShard {
  ShardAttributes attributes;
  PreferencePairs pairs;
};
[[nodiscard]] ShardAttributes read_shard_attributes(const std::string& path);
[[nodiscard]] SftShard read_sft_shard(const std::string& path);
[[nodiscard]] PreferenceShard read_preference_shard(const std::string& path);
struct PromptShard {
  ShardAttributes attributes;
  Prompts prompts;
};
// Also checks that every record is a JSON object (bad_input naming the prompt).
[[nodiscard]] PromptShard read_prompt_shard(const std::string& path);

}  // namespace l3::data
