#include "io/prep/input_split.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "temp_dir.hpp"

TEST_CASE("every line goes to exactly one rank, in order, for any number of ranks", "[prep]") {
  const l3::test::TempDir dir;
  std::vector<std::string> all;
  std::string a;
  for (int i = 0; i < 100; ++i) {
    const std::string line =
        fmt::format("a{}{}", i, std::string(static_cast<std::size_t>(i % 17), 'x'));
    a += line + (i % 10 == 0 ? "\r\n" : "\n");
    all.push_back(line);
  }
  dir.write("1.jsonl", a);
  std::string b = "b0\nb1\nlast line without newline";
  dir.write("2.jsonl", b);
  for (const char* l : {"b0", "b1", "last line without newline"}) all.emplace_back(l);
  {  // a gzip file: goes whole to one rank
    const std::string gz = (dir.path() / "3.jsonl.gz").string();
    gzFile f = gzopen(gz.c_str(), "wb");
    const std::string text = "g0\ng1\ng2\n";
    gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
    gzclose(f);
    for (const char* l : {"g0", "g1", "g2"}) all.emplace_back(l);
  }
  dir.write("4.jsonl", "");  // empty file
  const auto inputs = l3::prep::list_inputs({(dir.path() / "*.jsonl*").string()});
  REQUIRE(inputs.size() == 4);
  CHECK(inputs[2].gzip);
  for (int ranks = 1; ranks <= 7; ++ranks) {
    INFO(ranks << " ranks");
    std::vector<std::string> seen;
    for (int r = 0; r < ranks; ++r) {
      for (const auto& range : l3::prep::ranges_for_rank(inputs, r, ranks)) {
        l3::prep::for_each_line(
            inputs[range.file], range,
            [&](std::string_view line, std::int64_t) { seen.emplace_back(line); });
      }
    }
    CHECK(seen == all);
  }
}

TEST_CASE("line numbers for error messages, and bad input lists", "[prep]") {
  const l3::test::TempDir dir;
  const std::string path = dir.write("x.jsonl", "one\ntwo\nthree\n");
  const auto inputs = l3::prep::list_inputs({path});
  std::vector<std::int64_t> offsets;
  l3::prep::for_each_line(inputs[0], {0, 0, inputs[0].size},
                          [&](std::string_view, std::int64_t o) { offsets.push_back(o); });
  REQUIRE(offsets.size() == 3);
  CHECK(l3::prep::line_number_at(inputs[0], offsets[2]) == 3);
  CHECK(l3::prep::line_number_at(inputs[0], 0) == 1);
  CHECK_THROWS_AS(l3::prep::list_inputs({(dir.path() / "*.nothing").string()}), l3::core::Error);
  CHECK_THROWS_AS(l3::prep::list_inputs({dir.path().string()}), l3::core::Error);  // a directory
}

namespace {

// A .gz file of `text` cut to its first `keep` bytes (all of it when keep < 0).
std::string gzip_file(const l3::test::TempDir& dir, const std::string& name,
                      const std::string& text, long keep) {
  const std::string path = (dir.path() / name).string();
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  if (keep >= 0) std::filesystem::resize_file(path, static_cast<std::uintmax_t>(keep));
  return path;
}

std::vector<std::string> all_lines(const std::string& path) {
  const auto inputs = l3::prep::list_inputs({path});
  std::vector<std::string> lines;
  l3::prep::for_each_line(inputs[0], {0, 0, inputs[0].size},
                          [&](std::string_view line, std::int64_t) { lines.emplace_back(line); });
  return lines;
}

}  // namespace

TEST_CASE("a cut gzip stream is an error naming the file, not a shorter input", "[prep]") {
  const l3::test::TempDir dir;
  std::string text;
  for (int i = 0; i < 2000; ++i) text += fmt::format("{{\"text\": \"record {}\"}}\n", i);
  const std::string whole = gzip_file(dir, "whole.jsonl.gz", text, -1);
  CHECK(all_lines(whole).size() == 2000);
  const auto size = static_cast<long>(std::filesystem::file_size(whole));
  // Cut in the middle, just before the trailer's end, and after the 10-byte header alone.
  for (const long keep : {size / 2, size - 3, 10L}) {
    INFO("kept " << keep << " of " << size << " bytes");
    const std::string cut = gzip_file(dir, fmt::format("cut{}.jsonl.gz", keep), text, keep);
    try {
      (void)all_lines(cut);
      FAIL("a truncated file was read as complete");
    } catch (const l3::core::Error& e) {
      CHECK(e.kind() == l3::core::ErrorKind::bad_input);
      CHECK(std::string(e.what()).find(cut) != std::string::npos);
      CHECK(std::string(e.what()).find("truncated") != std::string::npos);
    }
  }
}

TEST_CASE("an input line longer than the limit is an error naming its line", "[prep]") {
  const l3::test::TempDir dir;
  // The limit is 256 MiB; a sparse file makes a line that long without writing it.
  const std::string path = dir.write("long.jsonl", "{}\n{}\n");
  std::filesystem::resize_file(path, (std::uintmax_t{256} << 20U) + 16);
  try {
    (void)all_lines(path);
    FAIL("a 256 MiB line was accepted");
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::bad_input);
    CHECK(std::string(e.what()).find(path + ":3:") != std::string::npos);
  }
  // From the middle of the file (another rank's share): the line number is still right.
  const auto inputs = l3::prep::list_inputs({path});
  try {
    l3::prep::for_each_line(inputs[0], {0, 4, inputs[0].size},
                            [](std::string_view, std::int64_t) {});
    FAIL("a 256 MiB line was accepted");
  } catch (const l3::core::Error& e) {
    CHECK(std::string(e.what()).find(path + ":3:") != std::string::npos);
  }
}
