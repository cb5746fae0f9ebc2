// How data parallelism cuts the flat parameter buffer (model/parameter_layout.hpp), as plain
// arithmetic: no MPI, no memory. Buckets are contiguous ranges reduced (and gathered) as one
// message, cut from the end of the buffer (where the backward pass starts) and kept in layout
// order; each bucket is split into one piece per rank, the part that rank owns (its optimizer
// state, its reduced gradients, what it writes to a checkpoint).
//
// Two modes: the whole buffer as one span (ZeRO-0/1), or one span per gradient group (ZeRO-2:
// a group's buckets never cross into another group, so that a group's reductions can start as
// soon as its backward is done). Parameter sharding cuts along the groups too.
//
// Buckets and pieces start at multiples of ParameterLayout::kAlignment elements, so that every
// element is updated by the same vector code path whatever the number of ranks; the last piece
// of a bucket takes its unaligned tail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/parameter_layout.hpp"

namespace l3::parallel {

struct ShardPlanInput {
  std::int64_t total = 0;                // elements of the flat buffer
  std::vector<model::FlatRange> groups;  // empty: the whole buffer as one span; else, in
                                         // layout order, groups covering [0, total)
  int ranks = 1;
  std::int64_t bucket_elements = std::int64_t{8} << 20;
  // The exchange prefers even pieces (NCCL's reduce-scatter): bucket sizes are then a multiple
  // of kAlignment x ranks, so that every bucket but the first of a span splits evenly.
  bool even_pieces = false;
};

class ShardPlan {
 public:
  static constexpr std::int64_t kAlign = model::ParameterLayout::kAlignment;

  // usage Error for a bucket size outside [kAlign, INT_MAX / 2] (one MPI message).
  explicit ShardPlan(ShardPlanInput input);

  [[nodiscard]] int ranks() const noexcept { return ranks_; }
  [[nodiscard]] std::int64_t total() const noexcept { return total_; }
  [[nodiscard]] const std::vector<model::FlatRange>& buckets() const noexcept { return buckets_; }
  // Piece `rank` of bucket `bucket` (may be empty for a small bucket on many ranks).
  [[nodiscard]] model::FlatRange piece(std::size_t bucket, int rank) const;
  [[nodiscard]] std::vector<model::FlatRange> pieces(std::size_t bucket) const;
  // The non-empty pieces `rank` owns, ascending.
  [[nodiscard]] std::vector<model::FlatRange> owned(int rank) const;

  // Per group mode: the groups, the buckets [first, last) of group g, the group of bucket b,
  // and the group holding flat position `offset` (groups().size() when none does).
  [[nodiscard]] bool by_group() const noexcept { return !groups_.empty(); }
  [[nodiscard]] const std::vector<model::FlatRange>& groups() const noexcept { return groups_; }
  [[nodiscard]] std::pair<std::size_t, std::size_t> group_buckets(std::size_t group) const {
    return group_buckets_.at(group);
  }
  [[nodiscard]] std::size_t group_of_bucket(std::size_t bucket) const {
    return bucket_group_.at(bucket);
  }
  [[nodiscard]] std::size_t group_at(std::int64_t offset) const noexcept;

  // [span.begin, span.end) cut into buckets of at most `bucket` elements from its end,
  // aligned, in layout order. span.begin aligned.
  [[nodiscard]] static std::vector<model::FlatRange> cut(model::FlatRange span,
                                                         std::int64_t bucket);

 private:
  std::int64_t total_;
  int ranks_;
  std::vector<model::FlatRange> buckets_;  // in layout order
  std::vector<model::FlatRange> groups_;
  std::vector<std::pair<std::size_t, std::size_t>> group_buckets_;  // [first, last) per group
  std::vector<std::size_t> bucket_group_;
};

}  // namespace l3::parallel
