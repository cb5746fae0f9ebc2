// Rank-aware logging with fmt. By default only rank 0 prints, so a 1000-rank job writes one line
// per message; --log-all-ranks makes every rank print, each line prefixed with [rank/size].
// A logger is a value owned by whoever runs the job (no process-wide state), so two sessions on
// disjoint communicators in one process log independently.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace l3::core {

enum class LogLevel { trace = 0, debug, info, warn, error, off };

[[nodiscard]] LogLevel parse_log_level(std::string_view name);  // throws a usage Error
[[nodiscard]] std::string_view to_string(LogLevel level) noexcept;

struct LogConfig {
  LogLevel level = LogLevel::info;
  bool all_ranks = false;  // false: only rank 0 prints (see Logger::local for per-rank facts)
  bool timestamps = true;  // UTC, millisecond resolution
};

// Receives one complete line (with its trailing newline). The default writes it to stderr
// with a single fwrite, which stdio keeps whole even when several threads log at once.
using LogSink = std::function<void(std::string_view line)>;
[[nodiscard]] LogSink stderr_sink();

class Logger {
 public:
  Logger() = default;  // rank 0 of 1, info, stderr
  Logger(int rank, int size, LogConfig config, LogSink sink = stderr_sink());

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] const LogConfig& config() const noexcept { return config_; }

  // True when a message at this level would be printed by this rank.
  [[nodiscard]] bool enabled(LogLevel level) const noexcept;

  template <typename... Args>
  void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) const {
    if (enabled(level)) write(level, fmt::format(format, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void trace(fmt::format_string<Args...> format, Args&&... args) const {
    log(LogLevel::trace, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void debug(fmt::format_string<Args...> format, Args&&... args) const {
    log(LogLevel::debug, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void info(fmt::format_string<Args...> format, Args&&... args) const {
    log(LogLevel::info, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) const {
    log(LogLevel::warn, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void error(fmt::format_string<Args...> format, Args&&... args) const {
    log(LogLevel::error, format, std::forward<Args>(args)...);
  }

  // A fact only this rank knows (its reader thread failed, its disk is slow): printed by the
  // calling rank whatever all_ranks says, still subject to the level.
  template <typename... Args>
  void local(LogLevel level, fmt::format_string<Args...> format, Args&&... args) const {
    if (level >= config_.level && level != LogLevel::off) {
      write(level, fmt::format(format, std::forward<Args>(args)...));
    }
  }

  // The full line as it would be written (exposed for tests and for log files).
  [[nodiscard]] std::string format_line(LogLevel level, std::string_view message) const;

 private:
  void write(LogLevel level, std::string_view message) const;

  int rank_ = 0;
  int size_ = 1;
  LogConfig config_{};
  LogSink sink_ = stderr_sink();
};

}  // namespace l3::core
