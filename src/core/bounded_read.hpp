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

namespace l3::core {

inline constexpr std::size_t kMaxLineBytes = std::size_t{256} << 20U;       // one JSONL record
inline constexpr std::size_t kMaxTextFileBytes = std::size_t{1} << 30U;     // JSON metadata
inline constexpr std::size_t kMaxConfigFileBytes = std::size_t{16} << 20U;  // --config FILE

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

// The whole file as text. bad_input Error naming it when it is a directory, cannot be opened or
// read, or holds more than `limit` bytes (`what` says what it should have been: "a config file").
[[nodiscard]] std::string read_text_file(const std::string& path, std::string_view what,
                                         std::size_t limit = kMaxTextFileBytes);

// A JSON object from a file (read_text_file's checks, then the parse): bad_input Error naming the
// file when it is not valid JSON or not an object (`what`: "a model config").
[[nodiscard]] nlohmann::json read_json_object(const std::string& path, std::string_view what,
                                              std::size_t limit = kMaxTextFileBytes);

// "256 MiB", for messages and documentation.
[[nodiscard]] std::string byte_size_text(std::size_t bytes);

}  // namespace l3::core
