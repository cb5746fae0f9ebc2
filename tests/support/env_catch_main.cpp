// main() for tests that need external data named by environment variables (L3_REQUIRED_ENV,
// a comma-separated list given at compile time): when one is unset every test exits 77
// (ctest's SKIP_RETURN_CODE) with a SKIP line saying which. Listing the tests needs nothing.
// A failed test case that drew random inputs prints the test seed (seed_listener.hpp).
#if L3_CATCH2_MAJOR < 3
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // the listeners' base classes
#endif
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "catch.hpp"
#include "catch_session.hpp"
#include "listing.hpp"
#include "seed_listener.hpp"

int main(int argc, char** argv) {
  if (!l3::test::listing_tests(argc, argv)) {
    const std::string required = L3_REQUIRED_ENV;
    std::size_t begin = 0;
    while (begin <= required.size()) {
      const std::size_t end = std::min(required.find(',', begin), required.size());
      const std::string name = required.substr(begin, end - begin);
      const char* value = std::getenv(name.c_str());
      if (!name.empty() && (value == nullptr || *value == '\0')) {
        std::printf(
            "SKIP: %s is not set (point it at the shared Llama 3 test data; .ci/run does)\n",
            name.c_str());
        return 77;
      }
      begin = end + 1;
    }
  }
  return l3::test::run_catch_session(argc, argv);
}
