#include "core/bounded_read.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "core/input_file.hpp"

namespace l3::core {

namespace {
constexpr std::size_t kChunk = std::size_t{1} << 16U;
}  // namespace

std::string byte_size_text(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 30U) && bytes % (std::size_t{1} << 30U) == 0)
    return fmt::format("{} GiB", bytes >> 30U);
  if (bytes >= (std::size_t{1} << 20U) && bytes % (std::size_t{1} << 20U) == 0)
    return fmt::format("{} MiB", bytes >> 20U);
  return fmt::format("{} bytes", bytes);
}

LineReader::LineReader(Source source, std::string name, bool numbered, std::size_t limit)
    : source_(std::move(source)),
      name_(std::move(name)),
      numbered_(numbered),
      limit_(limit),
      buffer_(kChunk) {}

// istream::getline returns at each newline (so a pipe is read line by line as it arrives, as
// `tail -f | llama3-hpc tokenize` needs) or when the buffer is full, without reading ahead.
LineReader::LineReader(std::istream& in, std::string name, bool numbered, std::size_t limit)
    : LineReader(
          [&in, name](char* buffer, std::size_t n) -> std::size_t {
            if (in.eof() || n < 2) return 0;
            in.getline(buffer, static_cast<std::streamsize>(n));
            const auto got = static_cast<std::size_t>(in.gcount());
            if (in.bad()) throw bad_input("read error", {.file = name});
            if (in.eof()) return got;  // the end, after a last line without a newline (or none)
            if (in.fail()) {           // the buffer is full, the line goes on
              in.clear();
              return got;
            }
            buffer[got - 1] = '\n';  // the newline was taken out and counted, not stored
            return got;
          },
          name, numbered, limit) {}

bool LineReader::fill() {
  if (finished_) return false;
  begin_ = 0;
  end_ = source_(buffer_.data(), buffer_.size());
  if (end_ == 0) finished_ = true;
  return end_ > 0;
}

bool LineReader::next(std::string& line) {
  line.clear();
  bool any = false;  // bytes seen for this line (a last line without "\n" counts)
  while (true) {
    if (begin_ == end_ && !fill()) {
      if (any) ++number_;
      return any;
    }
    any = true;
    const char* start = buffer_.data() + begin_;
    const char* stop = buffer_.data() + end_;
    const char* newline = std::find(start, stop, '\n');
    const auto take = static_cast<std::size_t>(newline - start);
    if (line.size() + take > limit_) {
      throw bad_input(fmt::format("a line longer than {} (the limit on one input line; "
                                  "docs/CLI.md): not line-oriented text",
                                  byte_size_text(limit_)),
                      {.file = name_, .line = numbered_ ? number_ + 1 : 0});
    }
    line.append(start, take);
    begin_ += take;
    if (newline != stop) {
      ++begin_;  // the "\n"
      ++number_;
      return true;
    }
  }
}

std::int64_t LineReader::skip_line() {
  std::int64_t skipped = 0;
  while (begin_ < end_ || fill()) {
    const char* start = buffer_.data() + begin_;
    const char* stop = buffer_.data() + end_;
    const char* newline = std::find(start, stop, '\n');
    const auto take = static_cast<std::size_t>(newline - start) + (newline != stop ? 1 : 0);
    begin_ += take;
    skipped += static_cast<std::int64_t>(take);
    if (newline != stop) return skipped;
  }
  return skipped;
}

std::string read_text_file(const std::string& path, std::string_view what, std::size_t limit) {
  const int fd = open_regular_file(path, what);
  std::string text;
  std::vector<char> chunk(kChunk);
  while (true) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      throw bad_input(fmt::format("read error: {}", errno_text(error)), {.file = path});
    }
    if (n == 0) break;
    if (text.size() + static_cast<std::size_t>(n) > limit) {
      ::close(fd);
      throw bad_input(fmt::format("longer than {}: not {}", byte_size_text(limit), what),
                      {.file = path});
    }
    text.append(chunk.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

namespace {

// Calls `structural(c)` for every character of JSON text outside its strings (escapes
// included); stops early when it returns false.
template <typename Visit>
void for_each_outside_strings(std::string_view text, Visit structural) {
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (!structural(c)) {
      return;
    }
  }
}

}  // namespace

int json_nesting_depth(std::string_view text, int stop) {
  int depth = 0;
  int deepest = 0;
  for_each_outside_strings(text, [&](char c) {
    if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    return deepest <= stop;
  });
  return deepest;
}

std::int64_t json_value_bound(std::string_view text) {
  std::int64_t bound = 1;
  for_each_outside_strings(text, [&](char c) {
    if (c == ',' || c == '[' || c == '{') ++bound;
    return true;
  });
  return bound;
}

nlohmann::json parse_json(std::string_view text, std::string_view what, const ErrorContext& where,
                          std::int64_t max_values) {
  const std::string noun = what.empty() ? std::string() : fmt::format(" ({})", what);
  if (json_nesting_depth(text) > kMaxJsonDepth) {
    throw bad_input(
        fmt::format("JSON nested deeper than {} levels{}: refused", kMaxJsonDepth, noun), where);
  }
  if (const std::int64_t values = json_value_bound(text); values > max_values) {
    throw bad_input(fmt::format("JSON of some {} values{}, more than the {} allowed: refused",
                                values, noun, max_values),
                    where);
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw bad_input(fmt::format("not valid JSON{}: {}", noun, e.what()), where);
  }
}

nlohmann::json parse_json_or_discard(std::string_view text) {
  if (json_nesting_depth(text) > kMaxJsonDepth || json_value_bound(text) > kMaxJsonValues)
    return nlohmann::json::value_t::discarded;
  return nlohmann::json::parse(text, nullptr, false);
}

nlohmann::json read_json_object(const std::string& path, std::string_view what, std::size_t limit,
                                std::int64_t max_values) {
  const std::string text = read_text_file(path, what, limit);
  nlohmann::json value = parse_json(text, what, {.file = path}, max_values);
  if (!value.is_object()) {
    throw bad_input(fmt::format("holds a JSON {}, not an object: not {}", value.type_name(), what),
                    {.file = path});
  }
  return value;
}

}  // namespace l3::core
