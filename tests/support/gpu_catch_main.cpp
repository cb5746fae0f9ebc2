// main() for GPU tests: without a usable CUDA device every test exits 77 (ctest's
// SKIP_RETURN_CODE) with a SKIP line (cuda_device_check.hpp). With L3_TEST_PROGRESS_FILE set,
// each test's start, failures and end go to that file as they happen (progress_listener.hpp). A
// failed test case that drew random inputs prints the test seed (seed_listener.hpp).
#if L3_CATCH2_MAJOR < 3
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // the listeners' base classes
#endif
#include "catch.hpp"
#include "catch_session.hpp"
#include "cuda_device_check.hpp"
#include "progress_listener.hpp"
#include "seed_listener.hpp"

int main(int argc, char** argv) {
  if (const int skip = l3::test::skip_without_cuda_device(argc, argv); skip != 0) return skip;
  return l3::test::run_catch_session(argc, argv);
}
