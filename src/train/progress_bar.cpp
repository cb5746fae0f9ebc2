#include "train/progress_bar.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace l3::train {

namespace {
constexpr int kWidth = 30;
}

ProgressBar::ProgressBar(ProgressMode mode, bool shown)
    : active_(shown && (mode == ProgressMode::always ||
                        (mode == ProgressMode::automatic && isatty(STDERR_FILENO) == 1))) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(std::int64_t done, std::int64_t total, const std::string& status) {
  if (!active_) return;
  const double fraction = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1;
  const int filled = static_cast<int>(fraction * kWidth);
  const std::string bar = std::string(static_cast<std::size_t>(filled), '#') +
                          std::string(static_cast<std::size_t>(kWidth - filled), '.');
  std::fputs(fmt::format("\r\033[K[{}] {:3.0f}% {}/{} {}", bar, 100 * fraction, done, total, status)
                 .c_str(),
             stderr);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!active_ || !drawn_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

void ProgressBar::finish() {
  if (!active_ || !drawn_) return;
  std::fputs("\n", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace l3::train
