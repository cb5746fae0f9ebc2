#include "core/timer.hpp"

#include <chrono>
#include <thread>

#include "catch.hpp"

TEST_CASE("stopwatch measures at least the time slept", "[timer]") {
  l3::core::Stopwatch watch;
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double first = watch.milliseconds();
  CHECK(first >= 5.0);
  CHECK(watch.seconds() * 1e3 >= first);  // monotonic
  watch.reset();
  CHECK(watch.milliseconds() < first + 1000.0);
}

TEST_CASE("accumulator keeps total, count, mean and max", "[timer]") {
  l3::core::TimeAccumulator acc;
  CHECK(acc.mean_seconds() == 0.0);
  acc.add(1.0);
  acc.add(3.0);
  CHECK(acc.total_seconds() == 4.0);
  CHECK(acc.count() == 2);
  CHECK(acc.mean_seconds() == 2.0);
  CHECK(acc.max_seconds() == 3.0);
  {
    const l3::core::ScopedTimer timed(acc);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(acc.count() == 3);
  CHECK(acc.total_seconds() >= 4.002);
  acc.clear();
  CHECK(acc.count() == 0);
}
