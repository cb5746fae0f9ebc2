// Byte-level BPE merging of one pre-token, in O(n log n): adjacent parts sit in a linked list
// and candidate merges in a min-heap keyed (priority, position), so the lowest-priority pair is
// merged first and ties go to the leftmost, as tiktoken and Hugging Face tokenizers do.
//
// Two rules for a merge's priority:
//  - tiktoken (`tokenizer.model`): parts a, b merge when a+b is a token; priority = its rank.
//  - Hugging Face (`tokenizer.json`): the pair (a, b) must be in the merges list; priority =
//    its index there.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace l3::tokenizer {

class BytePairEncoder {
 public:
  // tiktoken rule: token bytes -> id, ranks are the ids.
  static BytePairEncoder from_ranks(std::unordered_map<std::string, std::int32_t> ranks);
  // Hugging Face rule: token bytes -> id, plus the ordered merges (pairs of token bytes).
  static BytePairEncoder from_merges(
      std::unordered_map<std::string, std::int32_t> ids,
      const std::vector<std::pair<std::string, std::string>>& merges);

  // Appends the ids of `piece` (raw bytes of one pre-token) to `out`.
  void encode(std::string_view piece, std::vector<std::int32_t>& out) const;

  [[nodiscard]] const std::unordered_map<std::string, std::int32_t>& ids() const noexcept {
    return ids_;
  }

 private:
  BytePairEncoder() = default;
  // Priority of merging the adjacent parts a and b, or -1 when they do not merge.
  [[nodiscard]] std::int64_t priority(std::string_view a, std::string_view b) const;
  [[nodiscard]] static std::string pair_key(std::string_view a, std::string_view b);

  std::unordered_map<std::string, std::int32_t> ids_;
  std::unordered_map<std::string, std::int32_t> merge_rank_;  // empty for the tiktoken rule
  bool by_pair_ = false;
  mutable std::string scratch_;  // NOLINT: lookup key buffer
};

}  // namespace l3::tokenizer
