// Reading text of unknown size with a bound (core/bounded_read.hpp).
#include "core/bounded_read.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "temp_dir.hpp"

namespace {

std::vector<std::string> lines_of(const std::string& text, std::size_t limit) {
  std::istringstream in(text);
  l3::core::LineReader reader(in, "input", true, limit);
  std::vector<std::string> lines;
  std::string line;
  while (reader.next(line)) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("lines are read whole up to the limit, and a longer one is named", "[bounded-read]") {
  CHECK(lines_of("a\nbb\n\nccc", 8) == std::vector<std::string>{"a", "bb", "", "ccc"});
  CHECK(lines_of("", 8).empty());
  CHECK(lines_of("\n", 8) == std::vector<std::string>{""});
  const std::string long_text(200000, 'x');  // spans several read chunks
  CHECK(lines_of("a\n" + long_text + "\nb", 200000).size() == 3);
  try {
    (void)lines_of("a\nb\n" + long_text + "\n", 199999);
    FAIL("a line over the limit was accepted");
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::bad_input);
    CHECK(std::string(e.what()).starts_with("input:3: a line longer than 199999 bytes"));
  }
  // skip_line: through the next newline, whatever the length, nothing kept.
  std::istringstream in(long_text + "\nnext\n");
  l3::core::LineReader reader(in, "input", false, 10);
  CHECK(reader.skip_line() == static_cast<std::int64_t>(long_text.size()) + 1);
  std::string line;
  CHECK(reader.next(line));
  CHECK(line == "next");
}

TEST_CASE("whole files are read with a bound, directories and non-objects are named",
          "[bounded-read]") {
  const l3::test::TempDir dir;
  const std::string small = dir.write("small.json", R"({"a": 1})");
  CHECK(l3::core::read_text_file(small, "a config", 8) == R"({"a": 1})");
  CHECK_THROWS_AS(l3::core::read_text_file(small, "a config", 7), l3::core::Error);
  CHECK(l3::core::read_json_object(small, "a config").at("a") == 1);
  const auto kind_and_text = [](auto f) -> std::pair<l3::core::ErrorKind, std::string> {
    try {
      f();
    } catch (const l3::core::Error& e) {
      return {e.kind(), e.what()};
    }
    return {l3::core::ErrorKind::internal, "no error"};
  };
  const std::string array = dir.write("array.json", "[]");
  auto [kind, text] = kind_and_text([&] { (void)l3::core::read_json_object(array, "a config"); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text == array + ": holds a JSON array, not an object: not a config");
  std::tie(kind, text) =
      kind_and_text([&] { (void)l3::core::read_text_file(dir.path().string(), "a config"); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.find("is a directory") != std::string::npos);
  const std::string broken = dir.write("broken.json", "{\"a\": ");
  std::tie(kind, text) =
      kind_and_text([&] { (void)l3::core::read_json_object(broken, "a config"); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.starts_with(broken + ": not valid JSON"));
  // A file over the limit is refused at the limit, not read whole.
  const std::string big = dir.write("big.json", std::string((std::size_t{1} << 20U) + 1, ' '));
  std::tie(kind, text) = kind_and_text(
      [&] { (void)l3::core::read_text_file(big, "a config", std::size_t{1} << 20U); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text == big + ": longer than 1 MiB: not a config");
  // An endless source (/dev/zero) or a FIFO is not a file: refused at once, never read (a FIFO
  // without a writer would block the open forever).
  std::tie(kind, text) =
      kind_and_text([&] { (void)l3::core::read_text_file("/dev/zero", "a config"); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text == "/dev/zero: is a character device, not a config; inputs must be regular files");
  const std::string fifo = (dir.path() / "fifo.json").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::tie(kind, text) = kind_and_text([&] { (void)l3::core::read_json_object(fifo, "a config"); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text == fifo + ": is a named pipe (FIFO), not a config; inputs must be regular files");
  std::tie(kind, text) = kind_and_text([&] { l3::core::require_regular_file(fifo, "a shard"); });
  CHECK(text == fifo + ": is a named pipe (FIFO), not a shard; inputs must be regular files");
  const int fd = l3::core::open_regular_file(big, "a config");  // a regular file opens
  CHECK(fd >= 0);
  ::close(fd);
}

TEST_CASE("JSON nested deeper than the bound is refused before it is parsed", "[bounded-read]") {
  using l3::core::kMaxJsonDepth;
  CHECK(l3::core::json_nesting_depth(R"({"a": [1, {"b": "[[[{{{"}]})") == 3);
  CHECK(l3::core::json_nesting_depth(R"("\"[[[")") == 0);  // brackets in strings do not count
  const auto nested = [](std::size_t levels) {
    return std::string(levels, '[') + std::string(levels, ']');
  };
  CHECK(l3::core::parse_json(nested(kMaxJsonDepth), "", {}).is_array());
  // 200,000 levels (400 KB) overflowed the stack when the parsed value was copied or printed.
  for (const std::size_t levels : {std::size_t{kMaxJsonDepth} + 1, std::size_t{200000}}) {
    INFO(levels);
    try {
      (void)l3::core::parse_json(nested(levels), "a manifest", {.file = "m.json"});
      FAIL("accepted");
    } catch (const l3::core::Error& e) {
      CHECK(std::string(e.what()) ==
            "m.json: JSON nested deeper than 256 levels (a manifest): refused");
    }
    CHECK(l3::core::parse_json_or_discard(nested(levels)).is_discarded());
  }
  const l3::test::TempDir dir;
  const std::string deep =
      dir.write("deep.json", "{\"a\": " + std::string(60000, '[') + std::string(60000, ']') + "}");
  CHECK_THROWS_AS(l3::core::read_json_object(deep, "a config"), l3::core::Error);
}
