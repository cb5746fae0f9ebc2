#include "cli/run_outcome.hpp"

#include <vector>

#include "catch.hpp"

using l3::cli::RankOutcome;

TEST_CASE("the job's exit code: bad input over internal over checkpointed over ok", "[cli]") {
  using l3::cli::combine_exit_codes;
  CHECK(combine_exit_codes(std::vector<int>{0, 0, 0}) == 0);
  CHECK(combine_exit_codes(std::vector<int>{0, 75, 0}) == 75);
  CHECK(combine_exit_codes(std::vector<int>{75, 1, 0}) == 1);
  CHECK(combine_exit_codes(std::vector<int>{1, 2, 75}) == 2);
  CHECK(combine_exit_codes(std::vector<int>{0, 3, 75}) == 3);
  CHECK(combine_exit_codes(std::vector<int>{3, 2}) == 2);
  CHECK(combine_exit_codes(std::vector<int>{}) == 0);
}

TEST_CASE("rank lists are compressed into ranges", "[cli]") {
  using l3::cli::format_rank_list;
  CHECK(format_rank_list(std::vector<int>{0, 1, 2, 3, 5, 7, 8}) == "0-3,5,7-8");
  CHECK(format_rank_list(std::vector<int>{4}) == "4");
  CHECK(format_rank_list(std::vector<int>{}).empty());
}

TEST_CASE("rank 0 prints one line when all ranks agree, else one per message", "[cli]") {
  using l3::cli::error_lines;
  const std::vector<RankOutcome> same = {{2, "bad.ini: unknown option"},
                                         {2, "bad.ini: unknown option"}};
  CHECK(error_lines(same) == std::vector<std::string>{"error: bad.ini: unknown option"});

  const std::vector<RankOutcome> one_failed = {{0, ""}, {2, "shard 3: truncated"}, {0, ""}};
  CHECK(error_lines(one_failed) == std::vector<std::string>{"error: [rank 1] shard 3: truncated"});

  const std::vector<RankOutcome> differ = {{1, "A"}, {2, "B"}, {1, "A"}, {2, "B"}, {2, "B"}};
  CHECK(error_lines(differ) ==
        std::vector<std::string>{"error: [ranks 0,2] A", "error: [ranks 1,3-4] B"});

  std::vector<RankOutcome> many;
  many.reserve(20);
  for (int r = 0; r < 20; ++r) many.push_back({1, "message " + std::to_string(r)});
  const auto lines = error_lines(many, 3);
  REQUIRE(lines.size() == 4);
  CHECK(lines[3] == "error: ... and 17 more distinct error messages");
}
