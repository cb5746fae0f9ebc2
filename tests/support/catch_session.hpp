// The Catch2 session, run from the test mains (catch_main.cpp and its siblings). Catch2 v2's
// implementation is compiled once, in catch_session.cpp, rather than in every main: it is the
// single header's bulk (about 25 s of compile each, five mains in a CUDA build).
#pragma once

namespace l3::test {

// Catch::Session().run(argc, argv): the tests the arguments select; the exit code for main.
int run_catch_session(int argc, char** argv);

}  // namespace l3::test
