// The data-parallel cut of the flat buffer (parallel/shard_plan.hpp), without MPI: buckets cover
// the buffer in order from aligned starts, never cross a gradient group, and split into one
// piece per rank that together own every element exactly once.
#include "parallel/shard_plan.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"

using l3::model::FlatRange;
using l3::parallel::ShardPlan;
using l3::parallel::ShardPlanInput;

namespace {

constexpr std::int64_t kAlign = ShardPlan::kAlign;

// Groups of the given aligned sizes (the last may be unaligned), back to back from 0.
std::vector<FlatRange> groups_of(const std::vector<std::int64_t>& sizes) {
  std::vector<FlatRange> groups;
  std::int64_t at = 0;
  for (const std::int64_t n : sizes) {
    groups.push_back({at, at + n});
    at += n;
  }
  return groups;
}

// Every property the trainer relies on, for one plan.
void check_plan(const ShardPlan& plan, const ShardPlanInput& in, std::int64_t bucket) {
  const std::vector<FlatRange>& buckets = plan.buckets();
  REQUIRE(!buckets.empty());
  CHECK(buckets.front().begin == 0);
  CHECK(buckets.back().end == in.total);
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    INFO("bucket " << b << " [" << buckets[b].begin << ", " << buckets[b].end << ")");
    CHECK(buckets[b].size() > 0);
    CHECK(buckets[b].size() < bucket + kAlign);  // the aligned cut may add a tail
    CHECK(buckets[b].begin % kAlign == 0);
    if (b > 0) CHECK(buckets[b].begin == buckets[b - 1].end);
    // The pieces split the bucket in rank order, from aligned starts.
    const std::vector<FlatRange> pieces = plan.pieces(b);
    REQUIRE(static_cast<int>(pieces.size()) == in.ranks);
    std::int64_t at = buckets[b].begin;
    for (const FlatRange& p : pieces) {
      CHECK(p.begin == at);
      CHECK(p.end >= p.begin);
      CHECK(p.begin % kAlign == 0);
      at = p.end;
    }
    CHECK(at == buckets[b].end);
    if (in.even_pieces && buckets[b].size() == bucket) {
      for (const FlatRange& p : pieces) CHECK(p.size() == bucket / in.ranks);
    }
  }
  // owned(): every element once, over all ranks.
  std::vector<int> owners(static_cast<std::size_t>(in.total), 0);
  for (int r = 0; r < in.ranks; ++r) {
    std::int64_t last_end = -1;
    for (const FlatRange& p : plan.owned(r)) {
      CHECK(p.size() > 0);
      CHECK(p.begin >= last_end);  // ascending
      last_end = p.end;
      for (std::int64_t i = p.begin; i < p.end; ++i) ++owners[static_cast<std::size_t>(i)];
    }
  }
  std::int64_t wrong = 0;
  for (const int n : owners) wrong += n == 1 ? 0 : 1;
  CHECK(wrong == 0);
  // By group: buckets stay within their group, in order.
  if (plan.by_group()) {
    const std::vector<FlatRange>& groups = plan.groups();
    std::size_t next = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto [first, last] = plan.group_buckets(g);
      CHECK(first == next);
      CHECK(last > first);
      next = last;
      CHECK(buckets[first].begin == groups[g].begin);
      CHECK(buckets[last - 1].end == groups[g].end);
      for (std::size_t b = first; b < last; ++b) CHECK(plan.group_of_bucket(b) == g);
      CHECK(plan.group_at(groups[g].begin) == g);
      CHECK(plan.group_at(groups[g].end - 1) == g);
    }
    CHECK(next == buckets.size());
    CHECK(plan.group_at(in.total) == groups.size());
    CHECK(plan.group_at(-1) == groups.size());
  }
}

}  // namespace

TEST_CASE("a shard plan cuts the buffer into aligned buckets and one piece per rank") {
  // Sizes around the alignment and the bucket (one element, an unaligned tail, many buckets),
  // 1 to 5 ranks (pieces of small buckets are empty on many ranks), even pieces or not, the
  // whole buffer or groups (ZeRO-2).
  for (const std::int64_t total :
       {std::int64_t{1}, kAlign - 1, kAlign, 3 * kAlign + 5, 40 * kAlign, 40 * kAlign + 17}) {
    for (const int ranks : {1, 2, 3, 5}) {
      for (const std::int64_t bucket_elements : {kAlign, 3 * kAlign, 8 * kAlign + 7}) {
        for (const bool even : {false, true}) {
          for (const bool grouped : {false, true}) {
            ShardPlanInput in{.total = total,
                              .groups = {},
                              .ranks = ranks,
                              .bucket_elements = bucket_elements,
                              .even_pieces = even};
            if (grouped) {
              // An embedding-like first group, blocks, and the rest (unaligned tail).
              std::vector<std::int64_t> sizes;
              std::int64_t left = total;
              for (const std::int64_t n : {5 * kAlign, kAlign, 2 * kAlign}) {
                if (left > n) {
                  sizes.push_back(n);
                  left -= n;
                }
              }
              sizes.push_back(left);
              in.groups = groups_of(sizes);
            }
            const std::int64_t unit = even ? kAlign * ranks : kAlign;
            const std::int64_t bucket = std::max(unit, bucket_elements / unit * unit);
            INFO("total " << total << ", " << ranks << " ranks, bucket " << bucket_elements
                          << (even ? ", even" : "") << (grouped ? ", by group" : ""));
            const ShardPlan plan(in);
            check_plan(plan, in, bucket);
          }
        }
      }
    }
  }
}

TEST_CASE("a shard plan's buckets are cut from the end, where the backward pass starts") {
  const ShardPlan plan({.total = 10 * kAlign + 3,
                        .groups = {},
                        .ranks = 2,
                        .bucket_elements = 4 * kAlign,
                        .even_pieces = false});
  // The last two buckets are whole (4 x kAlign, the tail with the last); the first takes what
  // is left.
  REQUIRE(plan.buckets().size() == 3);
  CHECK(plan.buckets()[0].begin == 0);
  CHECK(plan.buckets()[0].end == 2 * kAlign);
  CHECK(plan.buckets()[1].begin == 2 * kAlign);
  CHECK(plan.buckets()[1].end == 6 * kAlign);
  CHECK(plan.buckets()[2].begin == 6 * kAlign);
  CHECK(plan.buckets()[2].end == 10 * kAlign + 3);
  // Rank 1 takes the unaligned tail of the last bucket.
  CHECK(plan.piece(2, 0).begin == 6 * kAlign);
  CHECK(plan.piece(2, 0).end == 8 * kAlign);
  CHECK(plan.piece(2, 1).begin == 8 * kAlign);
  CHECK(plan.piece(2, 1).end == 10 * kAlign + 3);
}

TEST_CASE("a shard plan refuses a bucket that is no MPI message") {
  for (const std::int64_t bad : {std::int64_t{0}, kAlign - 1, std::int64_t{1} << 31}) {
    INFO("bucket " << bad);
    CHECK_THROWS_AS(ShardPlan({.total = 1000,
                               .groups = {},
                               .ranks = 2,
                               .bucket_elements = bad,
                               .even_pieces = false}),
                    l3::core::Error);
  }
}
