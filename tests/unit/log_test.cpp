#include "core/log.hpp"

#include <regex>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"

using l3::core::LogConfig;
using l3::core::Logger;
using l3::core::LogLevel;

namespace {
struct Capture {
  std::vector<std::string> lines;
  l3::core::LogSink sink() {
    return [this](std::string_view line) { lines.emplace_back(line); };
  }
};
}  // namespace

TEST_CASE("only rank 0 logs unless all ranks are asked to", "[log]") {
  Capture c0;
  Capture c1;
  const Logger rank0(0, 4, LogConfig{}, c0.sink());
  const Logger rank1(1, 4, LogConfig{}, c1.sink());
  rank0.info("step {}", 1);
  rank1.info("step {}", 1);
  CHECK(c0.lines.size() == 1);
  CHECK(c1.lines.empty());

  Capture all;
  const Logger chatty(3, 4, LogConfig{.all_ranks = true}, all.sink());
  chatty.warn("disk slow");
  REQUIRE(all.lines.size() == 1);
  CHECK(all.lines[0].find("[3/4] warn: disk slow") != std::string::npos);

  // A fact only this rank knows is printed by it in any mode.
  rank1.local(LogLevel::error, "reader thread failed on shard {}", 7);
  REQUIRE(c1.lines.size() == 1);
  CHECK(c1.lines[0].find("[1/4] error: reader thread failed on shard 7") != std::string::npos);
}

TEST_CASE("levels filter and lines have timestamp, rank and level", "[log]") {
  Capture c;
  const Logger log(0, 2, LogConfig{.level = LogLevel::warn}, c.sink());
  log.debug("hidden");
  log.info("hidden");
  log.warn("shown {}", "w");
  log.error("shown {}", 'e');
  REQUIRE(c.lines.size() == 2);
  const std::regex line(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[0/2\] warn: shown w\n$)");
  CHECK(std::regex_match(c.lines[0], line));
  CHECK(log.enabled(LogLevel::error));
  CHECK_FALSE(log.enabled(LogLevel::info));

  Capture plain;
  const Logger untimed(0, 1, LogConfig{.timestamps = false}, plain.sink());
  untimed.info("x");
  CHECK(plain.lines.at(0) == "[0/1] info: x\n");

  Capture none;
  const Logger off(0, 1, LogConfig{.level = LogLevel::off}, none.sink());
  off.error("x");
  off.local(LogLevel::off, "x");
  CHECK(none.lines.empty());
}

TEST_CASE("log level names", "[log]") {
  CHECK(l3::core::parse_log_level("debug") == LogLevel::debug);
  CHECK(l3::core::parse_log_level("warning") == LogLevel::warn);
  CHECK(l3::core::to_string(LogLevel::error) == "error");
  CHECK_THROWS_AS(l3::core::parse_log_level("loud"), l3::core::Error);
}
