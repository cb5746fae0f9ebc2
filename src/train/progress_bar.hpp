// A one-line progress bar with ETA, redrawn in place, for runs watched in a terminal. Jobs
// whose stdout is a file (Slurm logs) get no bar, only the plain metric lines.
#pragma once

#include <cstdint>
#include <string>

namespace l3::train {

class ProgressBar {
 public:
  // Active only when `enabled` and stdout is a terminal.
  explicit ProgressBar(bool enabled);
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
