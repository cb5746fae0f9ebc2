#include "io/prep/input_split.hpp"

#include <fmt/format.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "io/prep/gzip_reader.hpp"

namespace l3::prep {

namespace fs = std::filesystem;

std::vector<InputFile> list_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> paths;
  for (const std::string& pattern : patterns) {
    // A path that exists is that file, whatever characters its name has: "p[1].jsonl" is not
    // the pattern that matches "p1.jsonl". Only a name that exists nowhere is expanded.
    if (struct stat info{}; ::lstat(pattern.c_str(), &info) == 0) {
      paths.push_back(pattern);
      continue;
    }
    glob_t matches{};
    // glob(3) is safe here: the process does not change the working directory concurrently
    errno = 0;
    const int rc = glob(pattern.c_str(), GLOB_ERR | GLOB_NOSORT, nullptr,
                        &matches);  // NOLINT(concurrency-mt-unsafe)
    const int error = errno;
    if (rc == GLOB_ABORTED) {  // a directory on the way could not be read: say so, not "no match"
      globfree(&matches);
      throw core::bad_input(
          fmt::format("cannot read the directory it is in: {}", core::errno_text(error)),
          {.file = pattern});
    }
    if (rc == GLOB_NOMATCH || matches.gl_pathc == 0) {
      globfree(&matches);
      // A plain path (no wildcard): why it cannot be used, e.g. a directory it cannot enter.
      if (pattern.find_first_of("*?[") == std::string::npos &&
          ::access(pattern.c_str(), F_OK) != 0 && errno != ENOENT) {
        throw core::bad_input(fmt::format("cannot access: {}", core::errno_text(errno)),
                              {.file = pattern});
      }
      throw core::bad_input("no input file matches", {.file = pattern});
    }
    if (rc != 0) {
      globfree(&matches);
      throw core::bad_input("cannot expand the input pattern", {.file = pattern});
    }
    for (std::size_t i = 0; i < matches.gl_pathc; ++i)
      paths.emplace_back(matches.gl_pathv[i]);  // NOLINT
    globfree(&matches);
  }
  std::sort(paths.begin(), paths.end());
  paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
  std::vector<InputFile> inputs;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) throw core::bad_input("not a regular file", {.file = path});
    const auto size = static_cast<std::int64_t>(fs::file_size(path, ec));
    if (ec) throw core::bad_input("cannot read the file size", {.file = path});
    if (!std::ifstream(path)) throw core::bad_input("cannot open for reading", {.file = path});
    inputs.push_back({path, size, path.ends_with(".gz")});
  }
  return inputs;
}

std::vector<FileRange> ranges_for_rank(const std::vector<InputFile>& inputs, int rank, int ranks) {
  std::int64_t total = 0;
  for (const InputFile& f : inputs) total += f.size;
  // This rank's share of the concatenated stream (the last rank takes the remainder).
  const auto share = [&](int r) { return total * r / ranks; };
  const std::int64_t begin = share(rank);
  const std::int64_t end = share(rank + 1);
  std::vector<FileRange> ranges;
  std::int64_t file_start = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::int64_t file_end = file_start + inputs[i].size;
    if (inputs[i].gzip) {
      // whole, to the rank whose share holds its first byte (an empty file: its position)
      const bool mine =
          (file_start >= begin && file_start < end) ||
          (rank == ranks - 1 && file_start >= end && inputs[i].size == 0 && file_start == total);
      if (mine) ranges.push_back({i, 0, inputs[i].size});
    } else {
      const std::int64_t lo = std::max(begin, file_start);
      const std::int64_t hi = std::min(end, file_end);
      if (lo < hi) ranges.push_back({i, lo - file_start, hi - file_start});
    }
    file_start = file_end;
  }
  return ranges;
}

namespace {

void emit(const std::string& text, std::int64_t offset,
          const std::function<void(std::string_view, std::int64_t)>& line) {
  std::string_view view(text);
  if (!view.empty() && view.back() == '\r') view.remove_suffix(1);
  line(view, offset);
}

}  // namespace

void for_each_line(const InputFile& input, const FileRange& range,
                   const std::function<void(std::string_view, std::int64_t)>& line) {
  std::string text;
  if (input.gzip) {
    GzipReader gz(input.path);  // a cut stream or trailing garbage is an error, never the end
    core::LineReader lines([&](char* buffer, std::size_t n) { return gz.read(buffer, n); },
                           input.path);
    std::int64_t offset = 0;
    while (lines.next(text)) {
      const std::int64_t start = offset;
      offset += static_cast<std::int64_t>(text.size()) + 1;
      emit(text, start, line);
    }
    return;
  }
  std::ifstream in(input.path, std::ios::binary);
  if (!in) throw core::bad_input("cannot open for reading", {.file = input.path});
  std::int64_t position = range.begin;
  if (position > 0) in.seekg(position - 1);
  core::LineReader lines(in, input.path, /*numbered=*/position == 0);
  // Start at the first line that begins at or after `begin`: skip from the byte before it
  // through the next newline (just that byte when `begin` starts a line).
  if (position > 0) position += lines.skip_line() - 1;
  while (position < range.end) {
    try {
      if (!lines.next(text)) break;
    } catch (core::Error& e) {
      e.add_context({.line = line_number_at(input, position)});
      throw;
    }
    const std::int64_t start = position;
    position += static_cast<std::int64_t>(text.size()) + 1;
    emit(text, start, line);
  }
}

std::int64_t line_number_at(const InputFile& input, std::int64_t offset) {
  std::int64_t number = 1;
  std::int64_t seen = 0;
  const auto count = [&](const char* data, std::int64_t n) {
    for (std::int64_t i = 0; i < n && seen < offset; ++i, ++seen) {
      if (data[i] == '\n') ++number;  // NOLINT
    }
  };
  std::vector<char> buffer(1 << 16);
  if (input.gzip) {
    try {
      GzipReader gz(input.path);
      while (seen < offset) {
        const std::size_t n = gz.read(buffer.data(), buffer.size());
        if (n == 0) break;
        count(buffer.data(), static_cast<std::int64_t>(n));
      }
    } catch (const core::Error&) {  // counted up to the damage: for a message only
    }
    return number;
  }
  std::ifstream in(input.path, std::ios::binary);
  while (in && seen < offset) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    count(buffer.data(), in.gcount());
  }
  return number;
}

}  // namespace l3::prep
