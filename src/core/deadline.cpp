#include "core/deadline.hpp"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>

#include "core/error.hpp"

namespace l3::core {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double parse_deadline(std::string_view text, double now_unix) {
  double seconds = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (ec == std::errc() && end == text.data() + text.size()) {
    if (!(seconds > 0) || !std::isfinite(seconds))
      throw usage_error(
          fmt::format("--deadline {}: seconds from now must be a positive number", text));
    return now_unix + seconds;
  }
  const std::string s(text);
  std::tm tm{};
  int year = 0;
  int month = 0;
  int consumed = 0;
  int second = 0;
  // Date and hours:minutes, optional :seconds, then Z, +HH:MM, -HH:MM or nothing (UTC).
  if (std::sscanf(s.c_str(), "%4d-%2d-%2d%*1[T ]%2d:%2d%n", &year, &month, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &consumed) != 5) {
    throw usage_error(fmt::format(
        "--deadline '{}': give seconds from now or an ISO-8601 time like 2026-11-30T12:00:00Z",
        text));
  }
  std::string_view rest = std::string_view(s).substr(static_cast<std::size_t>(consumed));
  if (rest.starts_with(':')) {
    int used = 0;
    if (std::sscanf(std::string(rest).c_str(), ":%2d%n", &second, &used) != 1)
      throw usage_error(fmt::format("--deadline '{}': bad seconds", text));
    rest.remove_prefix(static_cast<std::size_t>(used));
  }
  int offset_minutes = 0;
  const auto two_digits = [](std::string_view d) {
    return d.size() == 2 && d[0] >= '0' && d[0] <= '9' && d[1] >= '0' && d[1] <= '9'
               ? (d[0] - '0') * 10 + (d[1] - '0')
               : -1;
  };
  if (rest == "Z" || rest.empty()) {
    offset_minutes = 0;
  } else if ((rest.front() == '+' || rest.front() == '-') && rest.size() == 6 && rest[3] == ':') {
    const int hours = two_digits(rest.substr(1, 2));
    const int minutes = two_digits(rest.substr(4, 2));
    if (hours < 0 || hours > 23 || minutes < 0 || minutes > 59)
      throw usage_error(fmt::format("--deadline '{}': not a valid time zone offset", text));
    offset_minutes = (rest.front() == '+' ? 1 : -1) * (hours * 60 + minutes);
  } else {
    throw usage_error(fmt::format("--deadline '{}': unknown time zone '{}'", text, rest));
  }
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_sec = second;
  // timegm() would carry 2030-02-30 over to March 2: a date that does not exist is a typo.
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  constexpr std::array<int, 12> kDays{31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const int days = month >= 1 && month <= 12 ? kDays.at(static_cast<std::size_t>(month - 1)) +
                                                   (month == 2 && leap ? 1 : 0)
                                             : 0;
  if (year < 1970 || month < 1 || month > 12 || tm.tm_mday < 1 || tm.tm_mday > days ||
      tm.tm_hour < 0 || tm.tm_hour > 23 || tm.tm_min < 0 || tm.tm_min > 59 || second < 0 ||
      second > 60) {
    throw usage_error(fmt::format("--deadline '{}': not a valid date and time", text));
  }
  const double deadline = static_cast<double>(timegm(&tm)) - offset_minutes * 60.0;
  if (deadline <= now_unix) {
    // Accepted, the run would checkpoint and stop before its first step, every time it is
    // requeued: a typo in the date, not a plan.
    throw usage_error(
        fmt::format("--deadline {} is in the past ({:.0f} s ago)", text, now_unix - deadline));
  }
  return deadline;
}

SlurmEndTime slurm_end_time(const char* value) {
  if (value == nullptr) return {};
  long long t = 0;
  const std::string_view v(value);
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), t);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || t <= 0) {
    std::string shown(v.substr(0, 64));
    for (char& c : shown) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    return {.time = std::nullopt,
            .problem = fmt::format(
                "SLURM_JOB_END_TIME='{}'{} is not a time in Unix seconds: ignored, so the run "
                "will not checkpoint before the job's time limit (give --deadline)",
                shown, v.size() > 64 ? "..." : "")};
  }
  return {.time = static_cast<double>(t), .problem = {}};
}

}  // namespace l3::core
