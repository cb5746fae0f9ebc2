#include "io/data/prefetcher.hpp"

#include <atomic>
#include <chrono>
#include <thread>

#include "catch.hpp"
#include "core/error.hpp"

using l3::data::Prefetcher;

TEST_CASE("items arrive in order at every depth, with slow producers and slow consumers",
          "[prefetch]") {
  for (const int depth : {1, 2, 4}) {
    for (const bool slow_producer : {false, true}) {
      INFO("depth " << depth << ", slow " << (slow_producer ? "producer" : "consumer"));
      Prefetcher<std::vector<int>> p(depth, 10, [&](std::int64_t i, std::vector<int>& slot) {
        if (slow_producer) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        slot.assign(3, static_cast<int>(i));
      });
      for (int i = 10; i < 40; ++i) {
        const auto& item = p.next();
        REQUIRE(item == std::vector<int>(3, i));
        if (!slow_producer) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }
}

TEST_CASE("depth 1 does not overlap, depth 2 does", "[prefetch]") {
  std::atomic<int> produced{0};
  Prefetcher<int> one(1, 0, [&](std::int64_t i, int& slot) {
    slot = static_cast<int>(i);
    ++produced;
  });
  (void)one.next();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(produced == 1);  // the consumer holds the only slot
  (void)one.next();
  std::atomic<int> ahead{0};
  Prefetcher<int> two(2, 0, [&](std::int64_t i, int& slot) {
    slot = static_cast<int>(i);
    ++ahead;
  });
  (void)two.next();
  for (int k = 0; k < 200 && ahead < 2; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(ahead == 2);  // the next item is built while the first is in use
}

TEST_CASE("a producer failure surfaces at its item, never as a hang", "[prefetch]") {
  Prefetcher<int> p(2, 0, [](std::int64_t i, int& slot) {
    if (i == 3) throw l3::core::bad_input("shard-7.h5: bad token", {.record = "sample 9"});
    slot = static_cast<int>(i);
  });
  for (int i = 0; i < 3; ++i) CHECK(p.next() == i);
  try {
    (void)p.next();
    FAIL("no error");
  } catch (const l3::core::Error& e) {
    CHECK(std::string(e.what()) == "record sample 9: shard-7.h5: bad token");
  }
  CHECK_THROWS_AS(p.next(), l3::core::Error);  // and stays failed
}

TEST_CASE("destroying a prefetcher whose consumer stopped early does not hang", "[prefetch]") {
  auto p = std::make_unique<Prefetcher<int>>(
      2, 0, [](std::int64_t i, int& slot) { slot = static_cast<int>(i); });
  (void)p->next();
  p.reset();
  SUCCEED();
}

TEST_CASE("producers kept in step by a gate stop together and a waiting consumer gets an error",
          "[prefetch]") {
  std::atomic<int> gates{0};
  // The "other rank" wants to stop after 3 items: the gate says no more from the 4th on.
  Prefetcher<int> p(
      2, 0, [](std::int64_t i, int& slot) { slot = static_cast<int>(i); },
      [&](bool /*stopping*/) { return gates++ < 3; });
  for (int i = 0; i < 3; ++i) CHECK(p.next() == i);
  try {
    (void)p.next();
    FAIL("no error");
  } catch (const l3::core::Error& e) {
    CHECK(std::string(e.what()) == "the data loader was stopped on another rank");
  }
}
