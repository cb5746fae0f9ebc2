// Reading text of unknown size with a bound (core/bounded_read.hpp).
#include "core/bounded_read.hpp"

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
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
  // An endless source (/dev/zero) stops at the limit instead of filling the memory.
  std::tie(kind, text) = kind_and_text(
      [&] { (void)l3::core::read_text_file("/dev/zero", "a config", std::size_t{1} << 20U); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text == "/dev/zero: longer than 1 MiB: not a config");
}
