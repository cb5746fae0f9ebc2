// The input of `prep`, divided among ranks: the files (sorted, globs expanded) are seen as one
// byte stream; rank r takes the lines that start in its r-th share of it. A compressed file
// (.gz) cannot be entered in the middle, so it goes whole to the rank whose share holds its
// first byte. The division depends on the ranks only, never on the content, so every rank can
// compute its own part without reading anyone else's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace l3::prep {

struct InputFile {
  std::string path;
  std::int64_t size = 0;  // bytes on disk
  bool gzip = false;
};

// Whether a line holds no record: only spaces, tabs and a carriage return (a CRLF file's blank
// line). prep, tokenize --prep and generate skip such lines alike.
[[nodiscard]] inline bool is_blank_line(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// Expands globs, sorts, de-duplicates, stats. A path that exists is taken as it is, never as a
// pattern ("p[1].jsonl" is that file, not "p1.jsonl"); a name that exists nowhere is expanded
// (glob(3): *, ? and [...]). A pattern that matches nothing, a missing or unreadable file, is a
// bad_input Error naming it.
[[nodiscard]] std::vector<InputFile> list_inputs(const std::vector<std::string>& patterns);

struct FileRange {
  std::size_t file = 0;    // index into the input list
  std::int64_t begin = 0;  // lines starting in [begin, end) (whole file for gzip)
  std::int64_t end = 0;
};
[[nodiscard]] std::vector<FileRange> ranges_for_rank(const std::vector<InputFile>& inputs, int rank,
                                                     int ranks);

// Calls line(text, offset) for every line starting in the range; offset is the line's first
// byte in the (decompressed) file. A trailing "\r" is removed; the newline is not passed.
void for_each_line(const InputFile& input, const FileRange& range,
                   const std::function<void(std::string_view, std::int64_t)>& line);

// 1-based line number of the byte at `offset` of a (decompressed) file: counted only when an
// error needs it.
[[nodiscard]] std::int64_t line_number_at(const InputFile& input, std::int64_t offset);

}  // namespace l3::prep
