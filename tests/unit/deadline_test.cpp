#include "core/deadline.hpp"

#include <string>

#include "catch.hpp"
#include "core/error.hpp"

using l3::core::parse_deadline;

TEST_CASE("deadlines: seconds from now or ISO-8601 times", "[deadline]") {
  CHECK(parse_deadline("3600", 1000.0) == 4600.0);
  CHECK(parse_deadline("90.5", 0.0) == 90.5);
  // 2026-11-30T12:00:00Z = 1796040000 (date -u -d ... +%s)
  CHECK(parse_deadline("2026-11-30T12:00:00Z", 0) == 1796040000.0);
  CHECK(parse_deadline("2026-11-30T12:00Z", 0) == 1796040000.0);
  CHECK(parse_deadline("2026-11-30 12:00:00", 0) == 1796040000.0);
  CHECK(parse_deadline("2026-11-30T14:00:00+02:00", 0) == 1796040000.0);
  CHECK(parse_deadline("2026-11-30T07:30:00-04:30", 0) == 1796040000.0);
  CHECK(parse_deadline("2028-02-29T00:00Z", 0) == 1835395200.0);  // a leap day
  for (const char* bad :
       {"", "soon", "-5", "2026-13-01T00:00Z", "2026-11-30T12:00:00CET", "2026-11-30",
        // dates that do not exist, which timegm() would carry over into the next month
        "2030-02-30T00:00Z", "2027-02-29T00:00Z", "2100-02-29T00:00Z", "2030-04-31T12:00Z",
        "2030-01-00T00:00Z", "2030-01-01T24:00Z", "2030-01-01T00:60Z",
        // time zone offsets that are not one
        "2030-01-01T00:00+ab:cd", "2030-01-01T00:00+25:00", "2030-01-01T00:00+01:99"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_deadline(bad, 0), l3::core::Error);
  }
}

TEST_CASE("a deadline in the past or not a finite time is refused", "[deadline]") {
  // 2026-11-30T12:00:00Z = 1796040000: one second later it is in the past.
  try {
    (void)parse_deadline("2026-11-30T12:00:00Z", 1796040001.0);
    FAIL("accepted a deadline one second ago");
  } catch (const l3::core::Error& e) {
    CHECK(std::string(e.what()).find("in the past") != std::string::npos);
  }
  CHECK_THROWS_AS(parse_deadline("2026-11-30T12:00:00Z", 1796040000.0), l3::core::Error);
  for (const char* bad : {"inf", "nan", "0", "-inf", "1e400"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_deadline(bad, 1000.0), l3::core::Error);
  }
}

TEST_CASE("SLURM_JOB_END_TIME is read when it is a Unix time, and warned about otherwise",
          "[deadline]") {
  using l3::core::slurm_end_time;
  CHECK(slurm_end_time("1796040000").time == 1796040000.0);
  CHECK(slurm_end_time("1796040000").problem.empty());
  CHECK_FALSE(slurm_end_time(nullptr).time);
  CHECK(slurm_end_time(nullptr).problem.empty());
  for (const char* bad : {"", "0", "tomorrow", "-5", "1796040000x", "\x01\x02"}) {
    INFO(bad);
    CHECK_FALSE(slurm_end_time(bad).time);
    CHECK(slurm_end_time(bad).problem.find("SLURM_JOB_END_TIME") != std::string::npos);
  }
}
