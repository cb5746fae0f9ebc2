#include "dist/thread_budget.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "dist/communicator.hpp"

namespace l3::dist {

int CpuView::shared_cpus() const noexcept {
  const int node = std::max(1, node_cpus);
  if (quota_cpus > 0 && quota_cpus < node)
    return std::max(1, static_cast<int>(std::floor(quota_cpus)));
  return node;
}

ThreadBudget thread_budget(const CpuView& cpus, const char* omp_num_threads) {
  if (omp_num_threads != nullptr && *omp_num_threads != '\0') {
    const int n = std::atoi(omp_num_threads);
    if (n > 0) return {n, "OMP_NUM_THREADS"};
  }
  const int node = std::max(1, cpus.node_cpus);
  const int ranks = std::max(1, cpus.ranks_on_node);
  const int mask = cpus.affinity_cpus > 0 ? std::min(cpus.affinity_cpus, node) : node;
  const auto plural = [](int n, std::string_view what) {
    return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s");
  };
  // The candidates, each with its reason; the fewest cores wins (the first on ties).
  std::vector<ThreadBudget> limits;
  if (mask < node) {
    limits.push_back({mask, fmt::format("bound to {}", plural(mask, "cpu"))});
  } else {
    limits.push_back(
        {std::max(1, mask / ranks),
         fmt::format("{} / {} on the node", plural(mask, "cpu"), plural(ranks, "rank"))});
  }
  if (cpus.quota_cpus > 0 && cpus.quota_cpus < node) {
    const int shared = cpus.shared_cpus();
    limits.push_back(
        {std::max(1, shared / ranks), fmt::format("a CPU quota of {:g} cpus (cgroup cpu.max) / {}",
                                                  cpus.quota_cpus, plural(ranks, "rank"))});
  }
  if (cpus.slurm_cpus_per_task > 0) {
    limits.push_back({cpus.slurm_cpus_per_task,
                      fmt::format("SLURM_CPUS_PER_TASK={}", cpus.slurm_cpus_per_task)});
  }
  return *std::min_element(
      limits.begin(), limits.end(),
      [](const ThreadBudget& a, const ThreadBudget& b) { return a.threads < b.threads; });
}

double cgroup_cpu_quota(const char* cpu_max_file) {
  std::ifstream in(cpu_max_file);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  char* end = nullptr;
  const double q = std::strtod(quota.c_str(), &end);
  if (end == quota.c_str() || *end != '\0' || !(q > 0)) return 0;
  return q / period;
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
  const char* slurm = std::getenv("SLURM_CPUS_PER_TASK");
  const CpuView cpus{.affinity_cpus = available,
                     .node_cpus = online,
                     .ranks_on_node = world.local_size(),
                     .quota_cpus = cgroup_cpu_quota(),
                     .slurm_cpus_per_task = slurm != nullptr ? std::max(0, std::atoi(slurm)) : 0};
  ThreadBudget budget = thread_budget(cpus, std::getenv("OMP_NUM_THREADS"));
  omp_set_num_threads(budget.threads);
  // An OpenMP OpenBLAS follows omp_set_num_threads already; setting its count as well makes
  // it run its own team even inside our parallel regions (measured: 50x slower on 2 cores).
  if (openblas_get_parallel() != 2) openblas_set_num_threads(budget.threads);

  // The policy must be the same on every rank: passive everywhere when any rank wants it. A
  // plain MPI_Allreduce (not all_reduce, whose arrival depends on the policy being set).
  const WaitWish wish = wait_wish(cpus.shared_cpus(), world.local_size(), budget.threads,
                                  std::getenv("L3_WAIT_POLICY"));
  const int mine = wish.policy == WaitPolicy::passive ? 1 : 0;
  int any = 0;
  check_mpi(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, world.comm()),
            "MPI_Allreduce(wait policy)");
  budget.wait = any != 0 ? WaitPolicy::passive : WaitPolicy::active;
  budget.wait_reason = (mine == any) ? wish.reason : "as another rank asked";
  set_wait_policy(budget.wait);
  return budget;
}

int other_running_threads(int ranks_on_node, const char* stat_file) {
  int fewest = -1;
  for (int sample = 0; sample < 4; ++sample) {
    if (sample > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::ifstream in(stat_file);
    std::string key;
    long long value = -1;
    while (in >> key) {
      if (key == "procs_running") {
        in >> value;
        break;
      }
      in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    if (value < 0) return 0;
    fewest = fewest < 0 ? static_cast<int>(value) : std::min(fewest, static_cast<int>(value));
  }
  return std::max(0, fewest - std::max(1, ranks_on_node));
}

std::string busy_node_advice(int others, int cpus, int ranks_on_node, int threads) {
  cpus = std::max(1, cpus);
  ranks_on_node = std::max(1, ranks_on_node);
  if (others <= 0 || threads <= 1 || ranks_on_node * threads + others <= cpus) return {};
  const int fitting = std::max(1, (cpus - others) / ranks_on_node);
  return fmt::format(
      "the node is busy: {} other thread{} running beside this job's {} rank{} on {} cpus, and "
      "{} compute threads per rank wait on each other there (13x slower measured); "
      "OMP_NUM_THREADS={} avoids that (results then differ in their last bits from a run with "
      "{} threads)",
      others, others == 1 ? " was" : "s were", ranks_on_node, ranks_on_node == 1 ? "" : "s", cpus,
      threads, fitting, threads);
}

}  // namespace l3::dist
