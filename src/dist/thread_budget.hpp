// How many compute threads each rank should run. Without this, every rank of a node starts as
// many OpenMP and OpenBLAS threads as the node has cores, and N ranks oversubscribe the node
// N times over (with spinning OpenMP barriers, that is a slowdown of 10-40x, not N).
//
// The rule: OMP_NUM_THREADS, when set, wins (the user or the job script decided). Otherwise the
// cores a rank may use are the fewest that any of these allows:
//   - the affinity mask the launcher bound it to (srun --cpu-bind, mpiexec -bind-to): all of it;
//   - a container's or job's CPU quota (cgroup v2 cpu.max, e.g. docker --cpus 2 on a 64-core
//     host, whose mask still shows 64): its share per rank on the node;
//   - Slurm's SLURM_CPUS_PER_TASK (an allocation launched without binding);
//   - an unbound rank: its share of the node's cores, cores / ranks on the node;
// and at least 1.
//
// The wait policy (dist/wait_policy.hpp): passive when the ranks of a node would run more compute
// threads than it has cores (ranks x threads > cores; e.g. 4 ranks on a 2-core node), where a
// rank spinning in MPI takes the core of the peer it waits for; active otherwise.
// L3_WAIT_POLICY=active|passive|auto overrides it. The policy is agreed over the world: passive
// on every rank as soon as one rank asks for it (a node with more ranks than cores slows every
// collective down, and the policy must be the same on all ranks of a communicator).
#pragma once

#include <string>

#include "dist/wait_policy.hpp"
#include "dist/world.hpp"

namespace l3::dist {

struct ThreadBudget {
  int threads = 1;
  std::string reason;  // "OMP_NUM_THREADS", "bound to 8 cpus", "16 cpus / 2 ranks on the node"
  WaitPolicy wait = WaitPolicy::active;
  std::string wait_reason;  // "4 ranks x 1 thread on 2 cpus", "L3_WAIT_POLICY=passive", ...
};

// What a rank may use, as the launcher, the container and Slurm say it.
struct CpuView {
  int affinity_cpus = 0;        // in the rank's affinity mask (0: unknown)
  int node_cpus = 1;            // online on the node
  int ranks_on_node = 1;        // this job's
  double quota_cpus = 0;        // cgroup v2 cpu.max: quota / period (0: no limit)
  int slurm_cpus_per_task = 0;  // SLURM_CPUS_PER_TASK (0: not set)
  // The cores the node's ranks share: the node's, or fewer under a quota.
  [[nodiscard]] int shared_cpus() const noexcept;
};

[[nodiscard]] ThreadBudget thread_budget(const CpuView& cpus, const char* omp_num_threads);

// This process's CPU quota from cgroup v2 (/sys/fs/cgroup/cpu.max, "max 100000" or
// "200000 100000"): quota / period in cpus, 0 when there is none or it cannot be read.
[[nodiscard]] double cgroup_cpu_quota(const char* cpu_max_file = "/sys/fs/cgroup/cpu.max");

// This rank's wish for the wait policy: L3_WAIT_POLICY's value when it is set ("active",
// "passive"; "auto" or unset: the rule above). Throws a usage Error for another value.
struct WaitWish {
  WaitPolicy policy = WaitPolicy::active;
  std::string reason;
};
[[nodiscard]] WaitWish wait_wish(int node_cpus, int ranks_on_node, int threads,
                                 const char* l3_wait_policy);

// Computes this rank's budget and applies it to OpenMP and OpenBLAS, and the wait policy agreed
// over the world (set_wait_policy). Collective over world. Returns what it applied.
ThreadBudget apply_thread_budget(const World& world);

// A node busy with other work (another job, a build, tests): the threads that were running
// beside this job's ranks, the fewest of a few samples of /proc/stat's procs_running 5 ms apart
// (a passing process is not counted) minus the job's ranks on the node; 0 when it cannot be
// read. The thread count is not changed for it (the CPU backend's results depend on the threads
// per rank in their last bits, and a rerun must give the same bits), but the log says what to do:
// on 2 cores with one busy process, a 1-rank SFT step ran 13x slower with 2 threads than with 1.
[[nodiscard]] int other_running_threads(int ranks_on_node, const char* stat_file = "/proc/stat");

// The warning for a busy node, or "" when ranks x threads + the others fit the cpus.
[[nodiscard]] std::string busy_node_advice(int others, int cpus, int ranks_on_node, int threads);

}  // namespace l3::dist
