#include "ckpt/rank_state.hpp"

#include <algorithm>
#include <iterator>
#include <stdexcept>

namespace l3::ckpt {

std::int64_t RankState::values() const noexcept {
  std::int64_t n = 0;
  for (const model::FlatRange& r : ranges) n += r.size();
  return n;
}

void RankState::allocate(std::vector<model::FlatRange> owned) {
  ranges = std::move(owned);
  const auto n = static_cast<std::size_t>(values());
  // resize, not assign: a recycled snapshot of the same size is neither refilled nor
  // reallocated (first-touch page faults cost more than the copy itself).
  master.resize(n);
  exp_avg.resize(n);
  exp_avg_sq.resize(n);
}

RankState restrict_state(const RankState& state, const std::vector<model::FlatRange>& ranges) {
  // Where each of state's ranges starts in its arrays; a range is found by binary search (a
  // tensor-parallel rank's state has a range per row of its row-parallel weights: millions at
  // 405B).
  std::vector<std::int64_t> starts(state.ranges.size());
  std::int64_t at = 0;
  for (std::size_t i = 0; i < state.ranges.size(); ++i) {
    starts[i] = at;
    at += state.ranges[i].size();
  }
  RankState out;
  out.allocate(ranges);
  std::int64_t to = 0;
  for (const model::FlatRange& want : ranges) {
    const auto after = std::upper_bound(
        state.ranges.begin(), state.ranges.end(), want.begin,
        [](std::int64_t begin, const model::FlatRange& have) { return begin < have.begin; });
    if (after == state.ranges.begin() || want.end > std::prev(after)->end) {
      throw std::out_of_range("restrict_state: a range outside the state");
    }
    const auto have = static_cast<std::size_t>(std::prev(after) - state.ranges.begin());
    const std::int64_t from = starts[have] + (want.begin - state.ranges[have].begin);
    const auto n = static_cast<std::size_t>(want.size());
    std::copy_n(state.master.begin() + from, n, out.master.begin() + to);
    std::copy_n(state.exp_avg.begin() + from, n, out.exp_avg.begin() + to);
    std::copy_n(state.exp_avg_sq.begin() + from, n, out.exp_avg_sq.begin() + to);
    to += want.size();
  }
  return out;
}

std::vector<TensorSlice> tensor_slices(const model::ParameterLayout& layout,
                                       const std::vector<model::FlatRange>& ranges) {
  const std::vector<model::TensorInfo>& tensors = layout.tensors();
  std::vector<TensorSlice> slices;
  std::int64_t position = 0;
  for (const model::FlatRange& r : ranges) {
    // The first tensor ending after the range's start (tensors ascend by offset), then on
    // while they start before its end: O(log tensors) a range, not O(tensors).
    auto t = std::partition_point(
        tensors.begin(), tensors.end(),
        [&](const model::TensorInfo& info) { return info.offset + info.numel <= r.begin; });
    for (; t != tensors.end() && t->offset < r.end; ++t) {
      const std::int64_t lo = std::max(r.begin, t->offset);
      const std::int64_t hi = std::min(r.end, t->offset + t->numel);
      if (lo >= hi) continue;
      slices.push_back({static_cast<std::size_t>(t - tensors.begin()), lo - t->offset, hi - lo,
                        position + (lo - r.begin)});
    }
    position += r.size();
  }
  return slices;
}

std::vector<TensorBlock> tensor_blocks(const model::ParameterLayout& layout,
                                       const std::vector<model::FlatRange>& ranges) {
  std::vector<TensorBlock> blocks;
  for (const TensorSlice& s : tensor_slices(layout, ranges)) {
    if (!blocks.empty()) {
      TensorBlock& b = blocks.back();
      const std::int64_t next_first = b.first + b.rows * b.stride;
      const bool extends = b.tensor == s.tensor && b.count == s.count &&
                           s.position == b.position + b.values() &&
                           (b.rows == 1 ? s.first > b.first + b.count : s.first == next_first);
      if (extends) {
        if (b.rows == 1) b.stride = s.first - b.first;
        ++b.rows;
        continue;
      }
    }
    blocks.push_back({s.tensor, s.first, s.count, 1, s.count, s.position});
  }
  return blocks;
}

}  // namespace l3::ckpt
