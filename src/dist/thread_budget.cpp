#include "dist/thread_budget.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "core/error.hpp"
#include "dist/communicator.hpp"

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

WaitWish wait_wish(int node_cpus, int ranks_on_node, int threads, const char* l3_wait_policy) {
  const std::string_view asked = l3_wait_policy == nullptr ? "" : l3_wait_policy;
  if (asked == "active") return {WaitPolicy::active, "L3_WAIT_POLICY=active"};
  if (asked == "passive") return {WaitPolicy::passive, "L3_WAIT_POLICY=passive"};
  if (!asked.empty() && asked != "auto") {
    throw core::Error(core::ErrorKind::usage,
                      fmt::format("L3_WAIT_POLICY={}: expected active, passive or auto", asked));
  }
  const long long demand =
      static_cast<long long>(std::max(1, ranks_on_node)) * std::max(1, threads);
  const std::string shares =
      fmt::format("{} rank{} x {} thread{} on {} cpus", ranks_on_node,
                  ranks_on_node == 1 ? "" : "s", threads, threads == 1 ? "" : "s", node_cpus);
  if (demand > std::max(1, node_cpus)) return {WaitPolicy::passive, shares};
  return {WaitPolicy::active, shares};
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

  // The policy must be the same on every rank: passive everywhere when any rank wants it. A
  // plain MPI_Allreduce (not all_reduce, whose arrival depends on the policy being set).
  const WaitWish wish =
      wait_wish(online, world.local_size(), budget.threads, std::getenv("L3_WAIT_POLICY"));
  const int mine = wish.policy == WaitPolicy::passive ? 1 : 0;
  int any = 0;
  check_mpi(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, world.comm()),
            "MPI_Allreduce(wait policy)");
  budget.wait = any != 0 ? WaitPolicy::passive : WaitPolicy::active;
  budget.wait_reason = (mine == any) ? wish.reason : "as another rank asked";
  set_wait_policy(budget.wait);
  return budget;
}

}  // namespace l3::dist
