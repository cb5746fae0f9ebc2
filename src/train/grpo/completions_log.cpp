#include "train/grpo/completions_log.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/bounded_read.hpp"
#include "core/error.hpp"

namespace l3::train::grpo {

namespace {

constexpr std::string_view kOption = "--log-completions";

// What the file holds, read once: where the suffix a resumed run drops begins, how many lines
// it has, whether the first line is a record of ours and whether the file ends in a newline.
struct Scan {
  bool empty = true;
  bool first_is_ours = false;
  bool ends_in_newline = true;
  std::int64_t size = 0;
  std::int64_t drop_from = -1;  // byte offset; -1: nothing to drop
  std::int64_t dropped_lines = 0;
};

// Reads the file open as `fd` line by line. `resumed_at`: the suffix of records of later steps
// (and a last line cut short) is found; without it only the first line is read.
Scan scan(int fd, const std::string& path, std::optional<std::int64_t> resumed_at) {
  Scan s;
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    throw core::bad_input(fmt::format("cannot look at: {}", core::errno_text(errno)),
                          {.file = path});
  }
  s.size = info.st_size;
  if (s.size == 0) return s;
  s.empty = false;
  char last = '\n';
  if (::pread(fd, &last, 1, s.size - 1) == 1) s.ends_in_newline = last == '\n';
  std::int64_t offset = 0;
  core::LineReader lines(
      [fd, &offset](char* buffer, std::size_t n) {
        const ssize_t got = ::pread(fd, buffer, n, offset);
        if (got < 0) {
          throw core::bad_input(fmt::format("cannot read: {}", core::errno_text(errno)));
        }
        offset += got;
        return static_cast<std::size_t>(got);
      },
      path);
  std::string line;
  std::int64_t at = 0;  // where `line` begins
  bool first = true;
  while (lines.next(line)) {
    const std::int64_t next = at + static_cast<std::int64_t>(line.size()) + 1;
    const bool is_last = next >= s.size;
    const nlohmann::json record = core::parse_json_or_discard(line);
    const std::optional<std::int64_t> step = completions_record_step(record);
    if (first) {
      s.first_is_ours = step.has_value();
      first = false;
      if (!resumed_at) return s;
    }
    const bool later = step && *step > *resumed_at;
    const bool cut_short =
        is_last && !s.ends_in_newline && record.is_discarded() && line.starts_with('{');
    if (later || cut_short) {
      if (s.drop_from < 0) s.drop_from = at;
      ++s.dropped_lines;
    } else {
      s.drop_from = -1;
      s.dropped_lines = 0;
    }
    at = next;
    line.clear();
  }
  return s;
}

}  // namespace

std::optional<std::int64_t> completions_record_step(const nlohmann::json& record) {
  if (!record.is_object()) return std::nullopt;
  const auto step = record.find("step");
  if (step == record.end() || !step->is_number_integer() || !record.contains("prompt_index") ||
      !record.contains("completion") || !record.contains("sample")) {
    return std::nullopt;
  }
  return step->get<std::int64_t>();
}

CompletionsLog::CompletionsLog(const std::string& path, std::optional<std::int64_t> resumed_at)
    : file_(std::make_unique<core::AppendedFile>(path, kOption)) {
  const int fd = file_->descriptor();
  const Scan s = scan(fd, path, resumed_at);
  if (s.empty) return;
  if (!s.first_is_ours) {
    throw core::bad_input(
        fmt::format("{} names a file that is not a completions log (its first line is not one "
                    "of its records): not appended to; name a new file",
                    kOption),
        {.file = path});
  }
  bool ends_in_newline = s.ends_in_newline;
  if (s.drop_from >= 0) {
    if (::ftruncate(fd, s.drop_from) != 0) {
      throw core::bad_input(
          fmt::format("{}: cannot drop the {} lines of the steps after {}: {}", kOption,
                      s.dropped_lines, *resumed_at, core::errno_text(errno)),
          {.file = path});
    }
    dropped_ = s.dropped_lines;
    ends_in_newline = true;  // cut at the start of a line
  }
  if (!ends_in_newline) file_->append("\n");  // the last line complete: ours never merge into it
}

}  // namespace l3::train::grpo
