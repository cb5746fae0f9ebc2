#include "io/tokenizer/bpe.hpp"

#include <fmt/format.h>

#include <queue>

#include "core/error.hpp"

namespace l3::tokenizer {

BytePairEncoder BytePairEncoder::from_ranks(std::unordered_map<std::string, std::int32_t> ranks) {
  BytePairEncoder e;
  e.ids_ = std::move(ranks);
  return e;
}

BytePairEncoder BytePairEncoder::from_merges(
    std::unordered_map<std::string, std::int32_t> ids,
    const std::vector<std::pair<std::string, std::string>>& merges) {
  BytePairEncoder e;
  e.ids_ = std::move(ids);
  e.by_pair_ = true;
  e.merge_rank_.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    e.merge_rank_.try_emplace(pair_key(merges[i].first, merges[i].second),
                              static_cast<std::int32_t>(i));
  }
  return e;
}

std::string BytePairEncoder::pair_key(std::string_view a, std::string_view b) {
  // length-prefixed, so that ("ab", "c") and ("a", "bc") differ
  std::string key;
  key.reserve(a.size() + b.size() + 4);
  const auto length = static_cast<std::uint32_t>(a.size());
  key.append(reinterpret_cast<const char*>(&length), sizeof(length));  // NOLINT: raw bytes
  key.append(a);
  key.append(b);
  return key;
}

std::int64_t BytePairEncoder::priority(std::string_view a, std::string_view b) const {
  if (by_pair_) {
    const auto it = merge_rank_.find(pair_key(a, b));
    return it == merge_rank_.end() ? -1 : it->second;
  }
  scratch_.assign(a);
  scratch_.append(b);
  const auto it = ids_.find(scratch_);
  return it == ids_.end() ? -1 : it->second;
}

void BytePairEncoder::encode(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (piece.empty()) return;
  if (!by_pair_) {  // tiktoken's shortcut: a piece that is a token is that token
    scratch_.assign(piece);
    if (const auto it = ids_.find(scratch_); it != ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const std::size_t n = piece.size();
  // Parts: part i covers piece[start[i], start[next[i]]); removed parts are skipped via next.
  std::vector<std::size_t> start(n + 1);
  std::vector<std::size_t> next(n + 1);
  std::vector<std::size_t> prev(n + 1);
  std::vector<std::uint32_t> version(n + 1, 0);
  for (std::size_t i = 0; i <= n; ++i) {
    start[i] = i;
    next[i] = i + 1;
    prev[i] = i == 0 ? 0 : i - 1;
  }
  auto text = [&](std::size_t i) { return piece.substr(start[i], start[next[i]] - start[i]); };

  struct Candidate {
    std::int64_t priority;
    std::size_t left;  // the left part; merges with next[left]
    std::uint32_t left_version;
    std::uint32_t right_version;
    bool operator>(const Candidate& o) const {
      return priority != o.priority ? priority > o.priority : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](std::size_t left) {
    const std::size_t right = next[left];
    if (left >= n || right >= n) return;
    const std::int64_t p = priority(text(left), text(right));
    if (p >= 0) heap.push({p, left, version[left], version[right]});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) consider(i);

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const std::size_t right = next[c.left];
    if (right >= n || version[c.left] != c.left_version || version[right] != c.right_version) {
      continue;  // one of the parts changed since this candidate was queued
    }
    next[c.left] = next[right];  // absorb the right part
    prev[next[right]] = c.left;
    ++version[c.left];
    ++version[right];
    if (c.left != 0) consider(prev[c.left]);  // part 0 is never absorbed: it is the head
    consider(c.left);
  }

  for (std::size_t i = 0; i < n; i = next[i]) {
    const std::string_view part = text(i);
    scratch_.assign(part);
    const auto it = ids_.find(scratch_);
    if (it == ids_.end()) {
      throw core::internal_error(
          fmt::format("BPE: no token for a part of {} bytes (the "
                      "vocabulary lacks a single byte?)",
                      part.size()));
    }
    out.push_back(it->second);
  }
}

}  // namespace l3::tokenizer
