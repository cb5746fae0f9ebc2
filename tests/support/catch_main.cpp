// main() for the unit tests (the same for Catch2 v2 and v3). A failed test case that drew random
// inputs prints the test seed (seed_listener.hpp).
#if L3_CATCH2_MAJOR < 3
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // the listeners' base classes
#endif
#include "catch.hpp"
#include "catch_session.hpp"
#include "seed_listener.hpp"

int main(int argc, char** argv) { return l3::test::run_catch_session(argc, argv); }
