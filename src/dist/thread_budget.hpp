// How many compute threads each rank should run. Without this, every rank of a node starts as
// many OpenMP and OpenBLAS threads as the node has cores, and N ranks oversubscribe the node
// N times over (with spinning OpenMP barriers, that is a slowdown of 10-40x, not N).
//
// The rule: OMP_NUM_THREADS, when set, wins (the user or the job script decided). Otherwise a
// rank that the launcher bound to a subset of the cores (srun --cpus-per-task, mpiexec
// -bind-to) uses the cores it is bound to; an unbound rank takes its share of the node's
// cores: cores / ranks on the node, at least 1.
#pragma once

#include <string>

#include "dist/world.hpp"

namespace l3::dist {

struct ThreadBudget {
  int threads = 1;
  std::string reason;  // "OMP_NUM_THREADS", "bound to 8 cpus", "16 cpus / 2 ranks on the node"
};

[[nodiscard]] ThreadBudget thread_budget(int available_cpus, int node_cpus, int ranks_on_node,
                                         const char* omp_num_threads);

// Computes this rank's budget and applies it to OpenMP and OpenBLAS. Collective over nothing
// (uses world.local_size()). Returns what it applied.
ThreadBudget apply_thread_budget(const World& world);

}  // namespace l3::dist
