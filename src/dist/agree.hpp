// Collective failure checks: after a phase where each rank works alone (reading its part of
// the input, writing its shards), all ranks learn whether any failed before they enter the next
// collective, so a failure on one rank never leaves the others waiting in a collective.
#pragma once

#include <exception>

#include "dist/world.hpp"

namespace l3::dist {

// Collective. `local` is this rank's failure (null when it succeeded). When any rank failed:
// the failing ranks rethrow their own exception, the others throw core::PeerFailure with the
// largest exit code seen. Otherwise returns.
void agree_on_failure(const World& world, const std::exception_ptr& local);

}  // namespace l3::dist
