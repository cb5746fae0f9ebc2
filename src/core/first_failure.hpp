// The first failure of a sequence of steps that must all be attempted in step with other ranks:
// a rank whose disk fails still takes part in every exchange that follows (its peers would
// otherwise wait for it forever), skipping its own file work, and the ranks agree on the
// failure afterwards.
#pragma once

#include <exception>
#include <functional>
#include <string>

#include "core/error.hpp"

namespace l3::core {

struct FirstFailure {
  std::string text;  // empty while nothing failed

  // Runs `work` unless an earlier one failed; keeps the first failure's one-line summary.
  void run(const std::function<void()>& work) {
    if (!text.empty()) return;
    try {
      work();
    } catch (...) {
      text = summarize(std::current_exception()).text;
    }
  }
};

}  // namespace l3::core
