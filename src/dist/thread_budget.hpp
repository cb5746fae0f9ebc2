// How many compute threads each rank should run. Without this, every rank of a node starts as
// many OpenMP and OpenBLAS threads as the node has cores, and N ranks oversubscribe the node
// N times over (with spinning OpenMP barriers, that is a slowdown of 10-40x, not N).
//
// The rule: OMP_NUM_THREADS, when set, wins (the user or the job script decided). Otherwise a
// rank that the launcher bound to a subset of the cores (srun --cpus-per-task, mpiexec
// -bind-to) uses the cores it is bound to; an unbound rank takes its share of the node's
// cores: cores / ranks on the node, at least 1.
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

[[nodiscard]] ThreadBudget thread_budget(int available_cpus, int node_cpus, int ranks_on_node,
                                         const char* omp_num_threads);

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

}  // namespace l3::dist
