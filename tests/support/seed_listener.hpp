// A Catch2 listener that prints the test seed (test_seed.hpp) after every failed test case of a
// process that drew from it: one line on stdout, which ctest --output-on-failure shows, with
// the setting that repeats the run. Include once, from a main compiled with
// CATCH_CONFIG_EXTERNAL_INTERFACES (v2) or against Catch2 v3.
#pragma once

#include <cstdio>

#include "catch.hpp"
#include "test_seed.hpp"

#if L3_CATCH2_MAJOR >= 3
#include <catch2/reporters/catch_reporter_event_listener.hpp>
#include <catch2/reporters/catch_reporter_registrars.hpp>
#endif

namespace l3::test {

#if L3_CATCH2_MAJOR >= 3
using SeedListenerBase = Catch::EventListenerBase;
#else
using SeedListenerBase = Catch::TestEventListenerBase;
#endif

class SeedListener : public SeedListenerBase {
 public:
  using SeedListenerBase::SeedListenerBase;

  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    if (stats.totals.assertions.failed == 0 || !test_seed_used()) return;
    std::printf("test seed %llu: rerun with L3_TEST_SEED=%llu to repeat these inputs\n",
                static_cast<unsigned long long>(test_seed()),
                static_cast<unsigned long long>(test_seed()));
    std::fflush(stdout);
  }
};

}  // namespace l3::test

// Catch2 v2's macro pastes the name into an identifier: it must be unqualified.
using l3::test::SeedListener;
CATCH_REGISTER_LISTENER(SeedListener)
