// Reading text whose size the program does not control (JSONL inputs, stdin, config files, JSON
// metadata) with a bound on the memory it takes: a line longer than kMaxLineBytes, or a whole
// file longer than its limit, is a bad_input Error naming the source, raised before the memory
// runs out (`--config /dev/zero`, `tokenize < /dev/zero`). docs/CLI.md states the limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <istream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace l3::core {

inline constexpr std::size_t kMaxLineBytes = std::size_t{256} << 20U;       // one JSONL record
inline constexpr std::size_t kMaxTextFileBytes = std::size_t{1} << 30U;     // JSON metadata
inline constexpr std::size_t kMaxConfigFileBytes = std::size_t{16} << 20U;  // --config FILE

// JSON nested deeper than this is refused before it is parsed: copying, printing or comparing a
// parsed value recurses once per level, and some 100,000 levels (a few hundred KB of brackets)
// overflow the stack. Nothing llama3-hpc reads nests more than a few levels.
inline constexpr int kMaxJsonDepth = 256;
// The most values (numbers, strings, arrays, objects...) parsed JSON may hold: a parsed value
// takes some 16 to 50 bytes of memory, many times the 2 bytes of text that "0," is, so an
// 80 MB list of zeros would take gigabytes. The largest metadata read (tokenizer.json, a 405B
// model's manifest) holds about a million.
inline constexpr std::int64_t kMaxJsonValues = std::int64_t{1} << 23U;

// Lines from a source of bytes, each at most `limit` bytes long (without its "\n").
class LineReader {
 public:
  // Reads up to n bytes into the buffer, returns how many (0: the end); throws on a read error.
  using Source = std::function<std::size_t(char* buffer, std::size_t n)>;

  // `numbered`: the source starts at line 1 (errors name the line); false for a source that
  // starts somewhere in a file (errors name the file only; the caller adds the line).
  LineReader(Source source, std::string name, bool numbered = true,
             std::size_t limit = kMaxLineBytes);
  // A std::istream (stdin, an ifstream positioned anywhere).
  LineReader(std::istream& in, std::string name, bool numbered = true,
             std::size_t limit = kMaxLineBytes);

  // The next line without its "\n" into `line`; false at the end (a last line without "\n" is
  // still a line). bad_input Error "name:N: a line longer than ..." when it exceeds the limit.
  bool next(std::string& line);
  // Skips the rest of the current line (to the next "\n") without keeping it, whatever its
  // length; returns the bytes skipped, "\n" included.
  std::int64_t skip_line();
  // The number of the line next() returned last (1-based).
  [[nodiscard]] std::int64_t line_number() const noexcept { return number_; }

 private:
  bool fill();

  Source source_;
  std::string name_;
  bool numbered_;
  std::size_t limit_;
  std::vector<char> buffer_;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  bool finished_ = false;
  std::int64_t number_ = 0;
};

// The whole file as text. bad_input Error naming it when it is not a regular file (a directory, a
// FIFO, a device: core/input_file.hpp), cannot be opened or read, or holds more than `limit` bytes
// (`what` says what it should have been: "a config file").
[[nodiscard]] std::string read_text_file(const std::string& path, std::string_view what,
                                         std::size_t limit = kMaxTextFileBytes);

// A JSON object from a file (read_text_file's checks, then parse_json's): bad_input Error naming
// the file when it is not valid JSON, nested too deep, or not an object (`what`: "a model config").
[[nodiscard]] nlohmann::json read_json_object(const std::string& path, std::string_view what,
                                              std::size_t limit = kMaxTextFileBytes,
                                              std::int64_t max_values = kMaxJsonValues);

// The deepest nesting of arrays and objects in JSON text (brackets inside strings do not count);
// counting stops as soon as it passes `stop`.
[[nodiscard]] int json_nesting_depth(std::string_view text, int stop = kMaxJsonDepth);
// An upper bound on the number of values in JSON text (its commas and opening brackets outside
// strings, plus one), counted without parsing.
[[nodiscard]] std::int64_t json_value_bound(std::string_view text);

// JSON text from a file, a line or a header, parsed: bad_input Error with `where` (the file, its
// line) when it is nested deeper than kMaxJsonDepth, holds more than `max_values` values, or is
// not valid JSON (`what`: "a dataset index"; empty: no noun in the message).
[[nodiscard]] nlohmann::json parse_json(std::string_view text, std::string_view what,
                                        const ErrorContext& where,
                                        std::int64_t max_values = kMaxJsonValues);
// The same without an error: a discarded value for text that is not JSON or is too deep (lines
// that may or may not be ours, e.g. a metrics file's).
[[nodiscard]] nlohmann::json parse_json_or_discard(std::string_view text);

// "256 MiB", for messages and documentation.
[[nodiscard]] std::string byte_size_text(std::size_t bytes);

}  // namespace l3::core
