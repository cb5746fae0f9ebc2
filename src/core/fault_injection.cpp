#include "core/fault_injection.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.hpp"

namespace l3::core {

namespace {

int parse_int(std::string_view text, std::string_view entry) {
  int value = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc{} || ptr != end) {
    throw usage_error(fmt::format("L3_FAULT: '{}' is not a number in '{}'", text, entry));
  }
  return value;
}

void perform(std::string_view action, std::string_view point, int rank, std::string_view entry) {
  const std::string where = fmt::format("injected fault at {} on rank {}", point, rank);
  if (action == "throw-internal") throw internal_error(where);
  if (action == "throw-input") throw bad_input(where);
  if (action == "kill") {
    std::raise(SIGKILL);
    return;
  }
  if (action.starts_with("exit:")) std::_Exit(parse_int(action.substr(5), entry));
  if (action.starts_with("fsize:")) {  // files may not grow past this (writes fail: EFBIG)
    const rlimit limit{static_cast<rlim_t>(parse_int(action.substr(6), entry)), RLIM_INFINITY};
    setrlimit(RLIMIT_FSIZE, &limit);
    std::signal(SIGXFSZ, SIG_IGN);
    return;
  }
  if (action == "raise:USR1" || action == "raise:TERM" || action == "raise:INT") {
    std::raise(action == "raise:USR1" ? SIGUSR1 : action == "raise:TERM" ? SIGTERM : SIGINT);
    return;
  }
  if (action.starts_with("sleep:")) {
    std::this_thread::sleep_for(std::chrono::seconds(parse_int(action.substr(6), entry)));
    return;
  }
  throw usage_error(
      fmt::format("L3_FAULT: unknown action '{}' in '{}' (use throw-internal, "
                  "throw-input, exit:CODE, kill, raise:USR1, raise:TERM, raise:INT, fsize:BYTES, "
                  "sleep:SECONDS)",
                  action, entry));
}

// How many times each point has been reached in this process (for "#N" entries).
int count_hit(std::string_view point) {
  static std::mutex mutex;
  static std::map<std::string, int, std::less<>> hits;
  const std::scoped_lock lock(mutex);
  auto found = hits.find(point);
  if (found == hits.end()) found = hits.emplace(std::string(point), 0).first;
  return ++found->second;
}

}  // namespace

void fault_point(std::string_view point, int rank) {
  const char* spec = std::getenv("L3_FAULT");
  if (spec == nullptr || *spec == '\0') return;
  const int hit = count_hit(point);
  std::string_view rest(spec);
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view entry = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (entry.empty()) continue;

    const auto at = entry.find('@');
    const auto equals = entry.find('=', at == std::string_view::npos ? 0 : at);
    if (at == std::string_view::npos || equals == std::string_view::npos) {
      throw usage_error(fmt::format("L3_FAULT: '{}' is not 'point@rank=action'", entry));
    }
    const std::string_view entry_point = entry.substr(0, at);
    std::string_view entry_rank = entry.substr(at + 1, equals - at - 1);
    const std::string_view action = entry.substr(equals + 1);
    int occurrence = 0;  // 0: every time
    if (const auto hash = entry_rank.find('#'); hash != std::string_view::npos) {
      occurrence = parse_int(entry_rank.substr(hash + 1), entry);
      entry_rank = entry_rank.substr(0, hash);
    }
    if (entry_point != point) continue;
    if (entry_rank != "*" && parse_int(entry_rank, entry) != rank) continue;
    if (occurrence != 0 && occurrence != hit) continue;
    perform(action, point, rank, entry);
  }
}

}  // namespace l3::core
