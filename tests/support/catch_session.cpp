// Catch2's implementation (v2: its single header with CATCH_CONFIG_RUNNER; v3: the library) and
// the one function the mains call into it (catch_session.hpp).
#if L3_CATCH2_MAJOR < 3
#define CATCH_CONFIG_RUNNER
#include "catch.hpp"
#else
#include <catch2/catch_session.hpp>
#endif
#include "catch_session.hpp"

int l3::test::run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }
