// A one-line progress bar with ETA on stderr, redrawn in place ("\r"), for runs watched in a
// terminal. Jobs whose stderr is a file (Slurm logs) get no bar, only the plain metric lines,
// unless asked for (ProgressMode::always: mpiexec hands rank 0's stderr to the terminal through
// a pipe, so the bar shows there too).
#pragma once

#include <cstdint>
#include <string>

#include "train/run_choices.hpp"

namespace l3::train {

class ProgressBar {
 public:
  // `shown`: false where this rank draws none (ranks other than 0).
  ProgressBar(ProgressMode mode, bool shown);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  ProgressBar(ProgressBar&&) = delete;
  ProgressBar& operator=(ProgressBar&&) = delete;

  [[nodiscard]] bool active() const noexcept { return active_; }
  void update(std::int64_t done, std::int64_t total, const std::string& status);
  // Erases the bar (before another line is printed); the next update redraws it.
  void clear();
  // Leaves the bar's last state on its own line.
  void finish();

 private:
  bool active_;
  bool drawn_ = false;
};

}  // namespace l3::train
