// The shared library's own translation unit: libllama3_hpc.so is l3_core's objects, linked whole
// (see src/CMakeLists.txt); this file anchors the target and checks that the public headers carry
// the project's version (set in CMakeLists.txt's project() and passed in by the build).
#include "l3/l3.h"
#include "l3/l3.hpp"

static_assert(L3_VERSION_MAJOR == L3_PROJECT_VERSION_MAJOR &&
                  L3_VERSION_MINOR == L3_PROJECT_VERSION_MINOR &&
                  L3_VERSION_PATCH == L3_PROJECT_VERSION_PATCH,
              "include/l3/l3.hpp's L3_VERSION_* must match project(VERSION) in CMakeLists.txt");
