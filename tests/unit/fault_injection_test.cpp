#include "core/fault_injection.hpp"

#include <cstdlib>

#include "catch.hpp"
#include "core/error.hpp"

namespace {
// Sets L3_FAULT for the scope of a test (the unit tests run on one thread, so changing the
// environment is safe here).
struct FaultEnv {
  explicit FaultEnv(const char* spec) {
    setenv("L3_FAULT", spec, 1);  // NOLINT(concurrency-mt-unsafe)
  }
  ~FaultEnv() {
    unsetenv("L3_FAULT");  // NOLINT(concurrency-mt-unsafe)
  }
  FaultEnv(const FaultEnv&) = delete;
  FaultEnv& operator=(const FaultEnv&) = delete;
  FaultEnv(FaultEnv&&) = delete;
  FaultEnv& operator=(FaultEnv&&) = delete;
};

l3::core::ErrorKind kind_thrown(std::string_view point, int rank) {
  try {
    l3::core::fault_point(point, rank);
  } catch (const l3::core::Error& e) {
    return e.kind();
  }
  FAIL("no fault was injected");
  return l3::core::ErrorKind::internal;
}
}  // namespace

TEST_CASE("faults fire only at their point and rank", "[fault]") {
  l3::core::fault_point("cli.run", 0);  // unset: nothing happens

  const FaultEnv env("ckpt.write@1=throw-internal,cli.run@*=throw-input");
  CHECK_NOTHROW(l3::core::fault_point("ckpt.write", 0));
  CHECK(kind_thrown("ckpt.write", 1) == l3::core::ErrorKind::internal);
  CHECK(kind_thrown("cli.run", 5) == l3::core::ErrorKind::bad_input);
  CHECK_NOTHROW(l3::core::fault_point("elsewhere", 1));
}

TEST_CASE("a malformed L3_FAULT is an error, not silence", "[fault]") {
  {
    const FaultEnv env("cli.run=throw-input");
    CHECK(kind_thrown("cli.run", 0) == l3::core::ErrorKind::usage);
  }
  {
    const FaultEnv env("cli.run@x=throw-input");
    CHECK(kind_thrown("cli.run", 0) == l3::core::ErrorKind::usage);
  }
  {
    const FaultEnv env("cli.run@0=explode");
    CHECK(kind_thrown("cli.run", 0) == l3::core::ErrorKind::usage);
  }
  {
    const FaultEnv env("cli.run@0=sleep:0");
    CHECK_NOTHROW(l3::core::fault_point("cli.run", 0));
  }
}

TEST_CASE("a fault with #N fires only the N-th time its point is reached", "[fault]") {
  const FaultEnv env("unit.counted@0#3=throw-input");
  CHECK_NOTHROW(l3::core::fault_point("unit.counted", 0));                  // 1st
  CHECK_NOTHROW(l3::core::fault_point("unit.counted", 0));                  // 2nd
  CHECK(kind_thrown("unit.counted", 0) == l3::core::ErrorKind::bad_input);  // 3rd
  CHECK_NOTHROW(l3::core::fault_point("unit.counted", 0));                  // 4th
}
