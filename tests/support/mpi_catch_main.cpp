// main() for MPI tests that play the host application: the test initialises MPI itself (as an
// embedding code would) before the library is used, and finalises it after. Ranks other than 0
// report only failures, so a passing run prints one summary. Built with L3_NEEDS_CUDA_DEVICE
// (MPI tests of the CUDA backend): without a CUDA device it exits 77 with a SKIP line first
// (cuda_device_check.hpp), and rank 0 logs its progress to L3_TEST_PROGRESS_FILE where that is
// set (progress_listener.hpp). A failed test case that drew random inputs prints the test seed
// (seed_listener.hpp).
#if L3_CATCH2_MAJOR < 3
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // the listeners' base classes
#endif
#include <mpi.h>

#include <string>
#include <vector>

#include "catch.hpp"
#include "catch_session.hpp"
#include "seed_listener.hpp"

#if defined(L3_NEEDS_CUDA_DEVICE)
#include <cstdlib>

#include "cuda_device_check.hpp"
#include "progress_listener.hpp"
#endif

int main(int argc, char** argv) {
#if defined(L3_NEEDS_CUDA_DEVICE)
  if (const int skip = l3::test::skip_without_cuda_device(argc, argv); skip != 0) return skip;
#endif
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  std::vector<std::string> words(argv, argv + argc);
  if (rank != 0) words.emplace_back("--reporter=compact");
#if defined(L3_NEEDS_CUDA_DEVICE)
  if (rank != 0) unsetenv("L3_TEST_PROGRESS_FILE");  // one writer; the listener opens it later
#endif
  std::vector<char*> args;
  args.reserve(words.size());
  for (std::string& word : words) args.push_back(word.data());
  int failed = l3::test::run_catch_session(static_cast<int>(args.size()), args.data());

  // The test passes only if it passed on every rank.
  int any_failed = 0;
  failed = failed != 0 ? 1 : 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
