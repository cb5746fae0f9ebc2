// How much memory this process's node lets it use: the physical memory, or less when a control
// group (a Slurm job's, a container's) sets a lower limit. For the check that a run fits before
// it allocates (train/memory_check.hpp).
#pragma once

#include <cstdint>

namespace l3::core {

// Bytes: min(physical memory, the cgroup v2 memory.max or v1 memory.limit_in_bytes that applies).
[[nodiscard]] std::int64_t host_memory_bytes();

}  // namespace l3::core
