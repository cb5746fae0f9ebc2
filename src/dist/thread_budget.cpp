#include "dist/thread_budget.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace l3::dist {

ThreadBudget thread_budget(int available_cpus, int node_cpus, int ranks_on_node,
                           const char* omp_num_threads) {
  if (omp_num_threads != nullptr && *omp_num_threads != '\0') {
    const int n = std::atoi(omp_num_threads);
    if (n > 0) return {n, "OMP_NUM_THREADS"};
  }
  available_cpus = std::max(1, available_cpus);
  if (available_cpus < node_cpus) {
    return {available_cpus,
            fmt::format("bound to {} cpu{}", available_cpus, available_cpus == 1 ? "" : "s")};
  }
  const int share = std::max(1, available_cpus / std::max(1, ranks_on_node));
  return {share, fmt::format("{} cpus / {} rank{} on the node", available_cpus, ranks_on_node,
                             ranks_on_node == 1 ? "" : "s")};
}

ThreadBudget apply_thread_budget(const World& world) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int available = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) available = CPU_COUNT(&set);
  const auto online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  if (available <= 0) available = online;
  ThreadBudget budget =
      thread_budget(available, online, world.local_size(), std::getenv("OMP_NUM_THREADS"));
  omp_set_num_threads(budget.threads);
  // An OpenMP OpenBLAS follows omp_set_num_threads already; setting its count as well makes
  // it run its own team even inside our parallel regions (measured: 50x slower on 2 cores).
  if (openblas_get_parallel() != 2) openblas_set_num_threads(budget.threads);
  return budget;
}

}  // namespace l3::dist
