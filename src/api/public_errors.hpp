// The public API's error boundary: whatever the library throws inside (core::Error with its
// context, a peer's failure, MPI or system errors, bad_alloc) leaves as one l3::Error with the
// CLI's exit code and one-line text.
#pragma once

#include <exception>

#include "core/error.hpp"
#include "l3/l3.hpp"

namespace l3::api {

template <typename Body>
void rethrow_as_public(Body&& body) {
  try {
    body();
  } catch (const l3::Error&) {
    throw;
  } catch (const core::PeerFailure& e) {
    throw l3::Error(e.exit_code(), "another rank of the session failed (it reports why)", true);
  } catch (...) {
    const core::ErrorSummary summary = core::summarize(std::current_exception());
    throw l3::Error(summary.exit_code, summary.text);
  }
}

}  // namespace l3::api
