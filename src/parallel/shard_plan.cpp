#include "parallel/shard_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "core/error.hpp"

namespace l3::parallel {

namespace {

std::int64_t align_down(std::int64_t x) { return x / ShardPlan::kAlign * ShardPlan::kAlign; }

}  // namespace

ShardPlan::ShardPlan(ShardPlanInput input)
    : total_(input.total), ranks_(input.ranks), groups_(std::move(input.groups)) {
  if (input.bucket_elements < kAlign ||
      input.bucket_elements > std::numeric_limits<int>::max() / 2) {
    throw core::usage_error(fmt::format("the gradient bucket must hold between {} and {} values",
                                        kAlign, std::numeric_limits<int>::max() / 2));
  }
  if (ranks_ < 1) throw core::internal_error("ShardPlan: no ranks");
  const std::int64_t unit = input.even_pieces ? kAlign * ranks_ : kAlign;
  const std::int64_t bucket = std::max(unit, input.bucket_elements / unit * unit);
  if (groups_.empty()) {
    buckets_ = cut({0, total_}, bucket);
    return;
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const std::size_t first = buckets_.size();
    const std::vector<model::FlatRange> within = cut(groups_[g], bucket);
    buckets_.insert(buckets_.end(), within.begin(), within.end());
    group_buckets_.emplace_back(first, buckets_.size());
    bucket_group_.insert(bucket_group_.end(), within.size(), g);
  }
}

std::vector<model::FlatRange> ShardPlan::cut(model::FlatRange span, std::int64_t bucket) {
  std::vector<model::FlatRange> cut;
  for (std::int64_t end = span.end; end > span.begin;) {
    const std::int64_t begin = std::max(span.begin, align_down(end - bucket));
    cut.push_back({begin, end});
    end = begin;
  }
  std::reverse(cut.begin(), cut.end());
  return cut;
}

model::FlatRange ShardPlan::piece(std::size_t bucket, int rank) const {
  const model::FlatRange b = buckets_.at(bucket);
  // Even split in units of kAlign elements; the last rank takes the unaligned tail.
  const std::int64_t units = (b.size() + kAlign - 1) / kAlign;
  auto edge = [&](int r) {
    return r >= ranks_ ? b.end : std::min(b.end, b.begin + units * r / ranks_ * kAlign);
  };
  return {edge(rank), edge(rank + 1)};
}

std::vector<model::FlatRange> ShardPlan::pieces(std::size_t bucket) const {
  std::vector<model::FlatRange> all;
  all.reserve(static_cast<std::size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) all.push_back(piece(bucket, r));
  return all;
}

std::vector<model::FlatRange> ShardPlan::owned(int rank) const {
  std::vector<model::FlatRange> ranges;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const model::FlatRange p = piece(b, rank);
    if (p.size() > 0) ranges.push_back(p);
  }
  return ranges;
}

std::size_t ShardPlan::group_at(std::int64_t offset) const noexcept {
  // The last group whose begin is at or before offset.
  const auto it =
      std::upper_bound(groups_.begin(), groups_.end(), offset,
                       [](std::int64_t o, const model::FlatRange& g) { return o < g.begin; });
  if (it == groups_.begin()) return groups_.size();
  const auto g = static_cast<std::size_t>(it - groups_.begin()) - 1;
  return offset < groups_[g].end ? g : groups_.size();
}

}  // namespace l3::parallel
