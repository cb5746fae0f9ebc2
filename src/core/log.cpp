#include "core/log.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "core/error.hpp"

namespace l3::core {

namespace {
constexpr std::array<std::string_view, 6> kLevelNames = {"trace", "debug", "info",
                                                         "warn",  "error", "off"};

std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", utc.tm_year + 1900,
                     utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, ms);
}
}  // namespace

LogLevel parse_log_level(std::string_view name) {
  for (std::size_t i = 0; i < kLevelNames.size(); ++i) {
    if (name == kLevelNames[i]) return static_cast<LogLevel>(i);
  }
  if (name == "warning") return LogLevel::warn;
  throw usage_error(
      fmt::format("unknown log level '{}' (use trace, debug, info, warn, error, off)", name));
}

std::string_view to_string(LogLevel level) noexcept {
  return kLevelNames.at(static_cast<std::size_t>(level));
}

LogSink stderr_sink() {
  return [](std::string_view line) {
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  };
}

Logger::Logger(int rank, int size, LogConfig config, LogSink sink)
    : rank_(rank), size_(size), config_(config), sink_(std::move(sink)) {}

bool Logger::enabled(LogLevel level) const noexcept {
  if (level < config_.level || level == LogLevel::off) return false;
  return rank_ == 0 || config_.all_ranks;
}

std::string Logger::format_line(LogLevel level, std::string_view message) const {
  std::string line;
  if (config_.timestamps) line = utc_timestamp() + ' ';
  line += fmt::format("[{}/{}] {}: {}\n", rank_, size_, to_string(level), message);
  return line;
}

void Logger::write(LogLevel level, std::string_view message) const {
  if (sink_) sink_(format_line(level, message));
}

}  // namespace l3::core
