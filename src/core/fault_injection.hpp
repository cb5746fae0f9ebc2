// Fault injection for tests of failure handling (error agreement now; kill-a-rank-mid-write
// checkpoint tests later). Inactive unless the environment variable L3_FAULT is set:
//
//   L3_FAULT="point@rank[#N]=action[,...]"     rank: a number or '*'; #N: only the N-th time
//                                               this process reaches the point (1-based)
//   actions: throw-internal | throw-input | exit:CODE | kill (SIGKILL self) | sleep:SECONDS |
//            raise:USR1 | raise:TERM (send the signal to self) |
//            fsize:BYTES (RLIMIT_FSIZE from here on: later writes fail as on a full disk)
//
// e.g. L3_FAULT="cli.run@1=throw-input" makes rank 1 fail with a bad-input error where the CLI
// starts the subcommand. Points are listed in docs/DEVELOPING.md.
#pragma once

#include <string_view>

namespace l3::core {

// Performs the action configured for (point, rank), if any. A malformed L3_FAULT is a usage
// Error, so a typo in a test cannot silently disable the fault it meant to inject.
void fault_point(std::string_view point, int rank);

}  // namespace l3::core
