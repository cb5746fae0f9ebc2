# Find every third-party dependency; when one is missing, say which Debian package provides it
# (scripts/install-deps.sh installs them all) and what to do elsewhere (Spack).
include(FindPackageHandleStandardArgs)

# l3_require(FOUND WHAT DEBIAN_PACKAGES SPACK_SPEC [SPACK_CONDITION]): stop with the fix when FOUND
# is false. Every SPACK_SPEC (with the variant it depends on, if any) is also recorded (l3_record_dependency) in the dependency list that tests/spack checks
# against spack/packages/llama3-hpc/package.py, so that the package cannot drift from the build.
function(l3_require found what debian_pkg spack_pkg)
  if(NOT ${found})
    # Virtual Spack packages (what package.py depends on) are installed through a provider.
    set(install "${spack_pkg}")
    if(spack_pkg STREQUAL "mpi")
      set(install "mpich (or another MPI)")
    elseif(spack_pkg STREQUAL "zlib-api")
      set(install "zlib")
    endif()
    message(FATAL_ERROR
      "llama3-hpc needs ${what}, which was not found.\n"
      "  Debian/Ubuntu: apt-get install ${debian_pkg}   (or run scripts/install-deps.sh)\n"
      "  Spack:         spack install ${install}   (then spack load it)\n"
      "  Elsewhere:     point CMAKE_PREFIX_PATH at its installation.")
  endif()
  l3_record_dependency("${spack_pkg}" "${ARGV4}")
endfunction()

# l3_record_dependency(SPACK_SPEC CONDITION): one line "SPACK_SPEC[ when CONDITION]" in
# ${PROJECT_BINARY_DIR}/l3-dependencies.txt, written at the end of the configure step.
function(l3_record_dependency spec condition)
  if(condition)
    set(spec "${spec} when ${condition}")
  endif()
  set_property(GLOBAL APPEND PROPERTY L3_DEPENDENCIES "${spec}")
endfunction()

function(l3_write_dependency_list)
  get_property(deps GLOBAL PROPERTY L3_DEPENDENCIES)
  list(JOIN deps "\n" text)
  file(WRITE "${PROJECT_BINARY_DIR}/l3-dependencies.txt" "${text}\n")
endfunction()

# MPI (any MPI-3 implementation; Debian's MPICH is what CI tests).
find_package(MPI COMPONENTS C CXX)
l3_require(MPI_CXX_FOUND "an MPI-3 implementation (C and C++ bindings)" "mpich libmpich-dev" "mpi")

# Parallel HDF5: the serial library cannot do rank-parallel shard reading or checkpoint writes.
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 COMPONENTS C)
l3_require(HDF5_FOUND "parallel HDF5" "libhdf5-mpich-dev" "hdf5+mpi")
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR
    "llama3-hpc needs a *parallel* HDF5, but the one found (${HDF5_VERSION}, ${HDF5_INCLUDE_DIRS}) "
    "is serial.\n  Debian/Ubuntu: apt-get install libhdf5-mpich-dev (and remove libhdf5-dev "
    "if its wrappers shadow the parallel build)\n  Spack: spack install hdf5+mpi")
endif()

find_package(Boost 1.71 COMPONENTS program_options)
l3_require(Boost_PROGRAM_OPTIONS_FOUND "Boost.Program_options" "libboost-program-options-dev"
           "boost+program_options")

find_package(fmt 8 QUIET)
l3_require(fmt_FOUND "fmt (>= 8)" "libfmt-dev" "fmt")

find_package(nlohmann_json 3.9 QUIET)
l3_require(nlohmann_json_FOUND "nlohmann-json (>= 3.9)" "nlohmann-json3-dev" "nlohmann-json")

find_package(OpenMP COMPONENTS CXX)
if(NOT OpenMP_CXX_FOUND)  # the compiler's, not a package: nothing to record for Spack
  message(FATAL_ERROR "llama3-hpc needs OpenMP support in the C++ compiler (GCC's libgomp: "
                      "Debian package g++; or a Clang with libomp).")
endif()

# OpenBLAS: we call cblas_sgemm and openblas_* directly, so we need its cblas.h, not any BLAS.
# The OpenMP-threaded build is preferred: it shares our OpenMP thread pool and runs serially
# inside our parallel regions (attention calls GEMMs from OpenMP threads), where the pthread
# build would start a second set of threads that compete for the same cores. Debian ships it
# as libopenblas-openmp-dev next to the default pthread build.
find_package(PkgConfig QUIET)
foreach(_l3_dir IN ITEMS "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/pkgconfig")
  if(EXISTS "${_l3_dir}/openblas.pc")
    set(ENV{PKG_CONFIG_PATH} "${_l3_dir}:$ENV{PKG_CONFIG_PATH}")
  endif()
endforeach()
if(PkgConfig_FOUND)
  pkg_check_modules(OPENBLAS QUIET IMPORTED_TARGET openblas)
  pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
  pkg_check_modules(XXHASH QUIET IMPORTED_TARGET libxxhash)
endif()
if(TARGET PkgConfig::OPENBLAS)
  add_library(l3_openblas ALIAS PkgConfig::OPENBLAS)
else()
  find_path(OPENBLAS_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas include/openblas)
  find_library(OPENBLAS_LIBRARY NAMES openblas)
  if(OPENBLAS_CBLAS_INCLUDE_DIR AND OPENBLAS_LIBRARY)
    add_library(l3_openblas_imported UNKNOWN IMPORTED)
    set_target_properties(l3_openblas_imported PROPERTIES IMPORTED_LOCATION "${OPENBLAS_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${OPENBLAS_CBLAS_INCLUDE_DIR}")
    add_library(l3_openblas ALIAS l3_openblas_imported)
  endif()
endif()
if(TARGET l3_openblas)
  set(L3_OPENBLAS_FOUND TRUE)
endif()
l3_require(L3_OPENBLAS_FOUND "OpenBLAS (library and cblas.h)" "libopenblas-dev" "openblas")

if(TARGET PkgConfig::PCRE2)
  add_library(l3_pcre2 ALIAS PkgConfig::PCRE2)
else()
  find_path(PCRE2_INCLUDE_DIR pcre2.h)
  find_library(PCRE2_LIBRARY NAMES pcre2-8)
  if(PCRE2_INCLUDE_DIR AND PCRE2_LIBRARY)
    add_library(l3_pcre2_imported UNKNOWN IMPORTED)
    set_target_properties(l3_pcre2_imported PROPERTIES IMPORTED_LOCATION "${PCRE2_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${PCRE2_INCLUDE_DIR}")
    add_library(l3_pcre2 ALIAS l3_pcre2_imported)
  endif()
endif()
if(TARGET l3_pcre2)
  set(L3_PCRE2_FOUND TRUE)
endif()
l3_require(L3_PCRE2_FOUND "PCRE2 (8-bit library)" "libpcre2-dev" "pcre2")

if(TARGET PkgConfig::XXHASH)
  add_library(l3_xxhash ALIAS PkgConfig::XXHASH)
else()
  find_path(XXHASH_INCLUDE_DIR xxhash.h)
  find_library(XXHASH_LIBRARY NAMES xxhash)
  if(XXHASH_INCLUDE_DIR AND XXHASH_LIBRARY)
    add_library(l3_xxhash_imported UNKNOWN IMPORTED)
    set_target_properties(l3_xxhash_imported PROPERTIES IMPORTED_LOCATION "${XXHASH_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${XXHASH_INCLUDE_DIR}")
    add_library(l3_xxhash ALIAS l3_xxhash_imported)
  endif()
endif()
if(TARGET l3_xxhash)
  set(L3_XXHASH_FOUND TRUE)
endif()
l3_require(L3_XXHASH_FOUND "xxHash (checkpoint checksums)" "libxxhash-dev" "xxhash")

find_package(OpenSSL COMPONENTS Crypto)
l3_require(OpenSSL_FOUND "OpenSSL's libcrypto (SHA-256 of tokenizers and checkpoints)" "libssl-dev"
           "openssl")
find_package(ZLIB)
l3_require(ZLIB_FOUND "zlib (reading .jsonl.gz)" "zlib1g-dev" "zlib-api")

# Protocol Buffers: TensorBoard's event files (--tensorboard), the library and protoc. Newer
# releases (Spack's) install a CMake package, which brings their abseil dependency along;
# Debian's is found by CMake's own FindProtobuf.
find_package(Protobuf CONFIG QUIET)
if(NOT Protobuf_FOUND)
  find_package(Protobuf MODULE)
endif()
if(Protobuf_FOUND AND TARGET protobuf::libprotobuf-lite AND TARGET protobuf::protoc)
  set(L3_PROTOBUF_FOUND TRUE)
endif()
l3_require(L3_PROTOBUF_FOUND "Protocol Buffers, the library and protoc (TensorBoard event files)"
           "libprotobuf-dev protobuf-compiler" "protobuf")

# Catch2 v2 (Debian 12) or v3 (newer distributions): tests/support/catch.hpp hides the difference.
if(L3_BUILD_TESTS)
  find_package(Catch2 QUIET)
  l3_require(Catch2_FOUND "Catch2 (v2 or v3) for the tests (or configure with -DL3_BUILD_TESTS=OFF)"
             "catch2" "catch2" "+tests")
  string(REGEX MATCH "^[0-9]+" L3_CATCH2_MAJOR "${Catch2_VERSION}")
  list(APPEND CMAKE_MODULE_PATH "${Catch2_DIR}")  # Catch.cmake (catch_discover_tests) lives there
  find_program(MPIEXEC_EXECUTABLE_FOR_TESTS NAMES ${MPIEXEC_EXECUTABLE} mpiexec)
endif()
