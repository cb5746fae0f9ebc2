#include "io/data/epoch_plan.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "catch.hpp"
#include "core/error.hpp"
#include "numeric_support.hpp"

using l3::data::DatasetIndex;
using l3::data::EpochPlan;
using l3::data::PlanConfig;

namespace {
// An index of n documents of the given lengths (no files needed by the plan).
DatasetIndex index_of(const std::vector<std::int32_t>& lengths,
                      l3::data::SampleKind kind = l3::data::SampleKind::sft) {
  DatasetIndex d;
  d.kind = kind;
  for (const std::int32_t length : lengths) {
    d.shard.push_back(0);
    d.offset.push_back(0);
    d.length.push_back(length);
    if (kind == l3::data::SampleKind::preference) {
      d.rejected_offset.push_back(0);
      d.rejected_length.push_back(length / 2 + 1);
      d.margin.push_back(0);
    }
  }
  return d;
}
std::vector<std::int32_t> random_lengths(std::size_t n, std::int32_t max) {
  l3::test::Random rnd(300);
  std::vector<std::int32_t> lengths = rnd.integers(n, max);
  for (auto& l : lengths) l += 1;
  return lengths;
}
// The rows of one global step, in order: the concatenation over ranks and micro-batches.
std::vector<std::vector<std::int64_t>> step_rows(const EpochPlan& plan, const PlanConfig& c,
                                                 std::int64_t step) {
  std::vector<std::vector<std::int64_t>> rows;
  for (int r = 0; r < c.world_size; ++r) {
    for (std::int64_t m = 0; m < c.accumulation(); ++m) {
      for (auto& row : plan.micro_batch(step, r, m)) rows.push_back(row);
    }
  }
  return rows;
}
}  // namespace

TEST_CASE("the epoch permutation is a permutation, fixed by (seed, epoch)", "[data]") {
  const auto p = l3::data::epoch_permutation(1000, 7, 0);
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 1000; ++i) REQUIRE(sorted[static_cast<std::size_t>(i)] == i);
  CHECK(p == l3::data::epoch_permutation(1000, 7, 0));
  CHECK(p != l3::data::epoch_permutation(1000, 7, 1));
  CHECK(p != l3::data::epoch_permutation(1000, 8, 0));
}

TEST_CASE("packing: whole documents, rows never overflow, every document once per epoch",
          "[data]") {
  const auto lengths = random_lengths(3000, 300);
  const DatasetIndex index = index_of(lengths);
  PlanConfig c{256, 16, 2, 2, 11, l3::data::LongSamples::truncate, 64};
  const EpochPlan plan = EpochPlan::build(index, c, 0);
  std::vector<int> seen(lengths.size(), 0);
  std::int64_t rows = 0;
  std::int64_t empty_rows = 0;
  for (std::int64_t step = 0; step < plan.steps(); ++step) {
    for (const auto& row : step_rows(plan, c, step)) {
      ++rows;
      if (row.empty()) ++empty_rows;
      std::int64_t used = 0;
      for (const std::int64_t s : row) {
        used += std::min<std::int64_t>(lengths[static_cast<std::size_t>(s)], 256);
        ++seen[static_cast<std::size_t>(s)];
      }
      REQUIRE(used <= 256);
    }
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  CHECK(empty_rows < 16);  // only the last step is padded
  CHECK(plan.truncated_samples() ==
        std::count_if(lengths.begin(), lengths.end(), [](std::int32_t l) { return l > 256; }));
  // packing is reasonably tight: rows are at least 85% full on average
  CHECK(static_cast<double>(
            std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0},
                            [](std::int64_t a, std::int32_t l) { return a + std::min(l, 256); })) /
            static_cast<double>((rows - empty_rows) * 256) >
        0.85);

  c.long_samples = l3::data::LongSamples::drop;
  const EpochPlan dropping = EpochPlan::build(index, c, 0);
  CHECK(dropping.skipped_samples() == plan.truncated_samples());
  CHECK(static_cast<std::int64_t>(dropping.all_samples().size()) ==
        3000 - dropping.skipped_samples());
}

TEST_CASE("the rows of a global step are the same whatever the number of ranks", "[data]") {
  const DatasetIndex index = index_of(random_lengths(500, 100));
  const PlanConfig one{128, 8, 4, 1, 3};
  for (const auto& [ranks, micro] :
       std::vector<std::pair<int, std::int64_t>>{{2, 4}, {4, 2}, {8, 1}, {2, 1}}) {
    PlanConfig c = one;
    c.world_size = ranks;
    c.micro_batch = micro;
    const EpochPlan a = EpochPlan::build(index, one, 5);
    const EpochPlan b = EpochPlan::build(index, c, 5);
    REQUIRE(a.steps() == b.steps());
    for (std::int64_t s = 0; s < a.steps(); ++s)
      REQUIRE(step_rows(a, one, s) == step_rows(b, c, s));
  }
}

TEST_CASE("reward plans: pairs per step, too-long pairs left out", "[data]") {
  auto lengths = random_lengths(101, 60);
  lengths[7] = 200;  // 200 + 101 > 128: does not fit a row
  const DatasetIndex index = index_of(lengths, l3::data::SampleKind::preference);
  const PlanConfig c{128, 8, 2, 2, 9};
  const EpochPlan plan = EpochPlan::build(index, c, 0);
  CHECK(plan.skipped_samples() == 1);
  CHECK(plan.steps() == (100 + 7) / 8);
  std::set<std::int64_t> seen;
  for (std::int64_t s = 0; s < plan.steps(); ++s) {
    for (const auto& unit : step_rows(plan, c, s)) {
      REQUIRE(unit.size() == 1);
      REQUIRE(seen.insert(unit.front()).second);
    }
  }
  CHECK(seen.size() == 100);
  CHECK(!seen.contains(7));
}

TEST_CASE("a global batch that does not divide is a usage error", "[data]") {
  const DatasetIndex index = index_of({5, 5, 5});
  PlanConfig c{16, 10, 4, 2, 0};
  CHECK_THROWS_AS(EpochPlan::build(index, c, 0), l3::core::Error);
}
