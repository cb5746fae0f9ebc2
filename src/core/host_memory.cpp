#include "core/host_memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <string>

namespace l3::core {

namespace {

// The first line of a small /proc or /sys file as a number of bytes, or -1 ("max", missing).
std::int64_t limit_in(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!std::getline(in, text) || text.size() > 32) return -1;
  std::int64_t value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && value > 0 ? value : -1;
}

// The cgroup of this process ("0::/slurm/uid_1/job_2/step_0" on v2): its directory's limit.
std::int64_t cgroup_limit() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::int64_t lowest = -1;
  while (std::getline(in, line) && line.size() < 4096) {
    const std::size_t last = line.rfind(':');
    if (last == std::string::npos) continue;
    const std::string group = line.substr(last + 1);
    const bool v2 = line.starts_with("0::");
    const bool v1_memory = line.find(":memory:") != std::string::npos;
    if (!v2 && !v1_memory) continue;
    const std::string base = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const std::int64_t limit =
        limit_in(base + group + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
    if (limit > 0) lowest = lowest < 0 ? limit : std::min(lowest, limit);
  }
  return lowest;
}

}  // namespace

std::int64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  std::int64_t bytes = pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : 0;
  if (const std::int64_t limit = cgroup_limit(); limit > 0 && (bytes == 0 || limit < bytes))
    bytes = limit;
  return bytes;
}

}  // namespace l3::core
