// safetensors: a hand-built file with known values, the 16-bit conversions, writer round trips
// (single and sharded), and the malformed-file matrix: every case is a bad_input Error that
// names the file (and the tensor where there is one), never a crash or a read out of bounds.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../support/catch.hpp"
#include "core/error.hpp"
#include "io/safetensors/float_formats.hpp"
#include "io/safetensors/safetensors_file.hpp"
#include "io/safetensors/safetensors_writer.hpp"
#include "temp_dir.hpp"

namespace {

using l3::safetensors::SafetensorsDType;
using l3::safetensors::SafetensorsFile;
using l3::safetensors::SafetensorsModel;

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[static_cast<std::size_t>(i)] =
        static_cast<char>((v >> (8U * static_cast<unsigned>(i))) & 0xFFU);
  return s;
}

std::string f32_bytes(std::initializer_list<float> values) {
  std::string s;
  for (const float v : values) {
    const auto bits = std::bit_cast<std::uint32_t>(v);
    for (unsigned i = 0; i < 4; ++i) s += static_cast<char>((bits >> (8U * i)) & 0xFFU);
  }
  return s;
}

std::string u16_bytes(std::initializer_list<std::uint16_t> values) {
  std::string s;
  for (const std::uint16_t v : values) {
    s += static_cast<char>(v & 0xFFU);
    s += static_cast<char>(v >> 8U);
  }
  return s;
}

// A file: 8-byte length (the header's, unless overridden), the header, the data.
std::string write_file(const l3::test::TempDir& dir, const std::string& name,
                       const std::string& header, const std::string& data,
                       std::optional<std::uint64_t> length = std::nullopt) {
  std::string path = (dir.path() / name).string();
  std::ofstream(path, std::ios::binary) << le64(length.value_or(header.size())) << header << data;
  return path;
}

// The error opening `path` gives (empty: none).
std::string open_error(const std::string& path) {
  try {
    const SafetensorsFile file(path);
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::bad_input);
    return e.what();
  }
  return {};
}

const char* const kGood = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
                          R"("c":{"dtype":"F16","shape":[1],"data_offsets":[12,14]},)"
                          R"("__metadata__":{"format":"pt"}})";
std::string good_data() {
  return f32_bytes({1.5F, -2.0F}) + u16_bytes({0x3FC0, 0xC000}) + u16_bytes({0x3C00});
}

}  // namespace

TEST_CASE("a hand-built safetensors file reads back its known values", "[safetensors]") {
  const l3::test::TempDir dir;
  const SafetensorsFile file(write_file(dir, "good.safetensors", kGood, good_data()));
  REQUIRE(file.header().tensors.size() == 3);
  CHECK(file.header().metadata.at("format") == "pt");
  std::vector<float> a(2);
  std::vector<float> b(2);
  std::vector<float> c(1);
  file.read("a", a);
  file.read("b", b);
  file.read("c", c);
  CHECK(a == std::vector<float>{1.5F, -2.0F});
  CHECK(b == std::vector<float>{1.5F, -2.0F});
  CHECK(c == std::vector<float>{1.0F});
  CHECK(file.header().find("b")->shape == std::vector<std::int64_t>{1, 2});
  CHECK_THROWS_WITH(file.read("a", std::span<float>(b).first(1)),
                    Catch::Contains("has 2 elements, 1 expected"));
  CHECK_THROWS_WITH(file.read("zz", a), Catch::Contains("no such tensor"));
}

TEST_CASE("bf16 rounds to nearest even, f16 decodes every class", "[safetensors]") {
  using l3::safetensors::bf16_to_float;
  using l3::safetensors::f16_to_float;
  using l3::safetensors::float_to_bf16;
  CHECK(float_to_bf16(1.0F) == 0x3F80);
  CHECK(float_to_bf16(1.0F + std::ldexp(1.0F, -8)) == 0x3F80);      // tie -> even
  CHECK(float_to_bf16(1.0F + 3 * std::ldexp(1.0F, -8)) == 0x3F82);  // tie -> even
  CHECK(float_to_bf16(1.0F + std::ldexp(1.0F, -7) + std::ldexp(1.0F, -9)) == 0x3F81);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity())) ==
        std::numeric_limits<float>::infinity());
  CHECK(bf16_to_float(float_to_bf16(-3.0F)) == -3.0F);
  CHECK(f16_to_float(0x3C00) == 1.0F);
  CHECK(f16_to_float(0xC000) == -2.0F);
  CHECK(f16_to_float(0x7BFF) == 65504.0F);
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0F, -24));
  CHECK(f16_to_float(0x7C00) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(f16_to_float(0x7E00)));
  CHECK(std::signbit(f16_to_float(0x8000)));
}

TEST_CASE("safetensors writer round trips: F32 bit for bit, BF16 rounded", "[safetensors]") {
  const l3::test::TempDir dir;
  std::vector<float> w(std::size_t{6} * 7);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(i)) * 3.0F;
  const std::vector<float> bias = {0.25F, -1e-30F, 7.0F};
  const std::vector<l3::safetensors::TensorToWrite> tensors = {{"z.weight", {6, 7}, w},
                                                               {"a.bias", {3}, bias}};
  for (const SafetensorsDType dtype : {SafetensorsDType::f32, SafetensorsDType::bf16}) {
    const std::string path = (dir.path() / "rt.safetensors").string();
    l3::safetensors::write_safetensors(path, tensors, dtype, {{"format", "pt"}});
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
    const SafetensorsFile file(path);
    CHECK(file.header().data_start % 8 == 0);
    CHECK(file.header().metadata.at("format") == "pt");
    std::vector<float> back(w.size());
    file.read("z.weight", back);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float expected =
          dtype == SafetensorsDType::f32
              ? w[i]
              : l3::safetensors::bf16_to_float(l3::safetensors::float_to_bf16(w[i]));
      CHECK(back[i] == expected);
    }
    std::vector<float> b(3);
    file.read("a.bias", b);
    CHECK(b[2] == 7.0F);
  }
}

TEST_CASE("safetensors ranges read what the whole tensor holds and a filled tensor writes alike",
          "[safetensors]") {
  const l3::test::TempDir dir;
  // More than one read chunk (2^20 elements) so that a range crosses chunks.
  std::vector<float> w(std::size_t{3} << 19U);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::cos(static_cast<float>(i) * 0.01F);
  for (const SafetensorsDType dtype : {SafetensorsDType::f32, SafetensorsDType::bf16}) {
    const std::string given = (dir.path() / "given.safetensors").string();
    const std::string filled = (dir.path() / "filled.safetensors").string();
    l3::safetensors::write_safetensors(given, {{"w", {3, 1 << 19}, w}}, dtype, {});
    // The same tensor produced when written (streaming): the same bytes.
    l3::safetensors::write_safetensors(
        filled,
        {{.name = "w",
          .shape = {3, 1 << 19},
          .values = {},
          .fill = [&](std::span<float> out) { std::copy(w.begin(), w.end(), out.begin()); }}},
        dtype, {});
    std::ifstream a(given, std::ios::binary);
    std::ifstream b(filled, std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(a), {}) ==
          std::string(std::istreambuf_iterator<char>(b), {}));

    const SafetensorsFile file(given);
    std::vector<float> whole(w.size());
    file.read("w", whole);
    for (const auto& [first, count] : {std::pair<std::int64_t, std::int64_t>{0, 5},
                                       {1000, (std::int64_t{1} << 20) + 77},
                                       {static_cast<std::int64_t>(w.size()) - 3, 3}}) {
      std::vector<float> part(static_cast<std::size_t>(count));
      file.read_range("w", first, part);
      CHECK(
          std::equal(part.begin(), part.end(), whole.begin() + static_cast<std::ptrdiff_t>(first)));
    }
    std::vector<float> beyond(4);
    CHECK_THROWS_WITH(file.read_range("w", static_cast<std::int64_t>(w.size()) - 3, beyond),
                      Catch::Contains("asked for") && Catch::Contains("'w'"));
  }
}

TEST_CASE("a sharded safetensors model reads through its index", "[safetensors]") {
  const l3::test::TempDir dir;
  const std::vector<float> x(1000, 1.0F);
  const std::vector<float> y(1000, 2.0F);
  const std::vector<float> z(10, 3.0F);
  const std::vector<l3::safetensors::TensorToWrite> tensors = {
      {"x", {10, 100}, x}, {"y", {1000}, y}, {"z", {10}, z}};
  const std::string model = (dir.path() / "model").string();
  const auto written =
      l3::safetensors::write_safetensors_model(model, tensors, SafetensorsDType::f32, 4500, {});
  REQUIRE(written.size() == 3);  // x | y z, and the index
  CHECK(written[0] == "model-00001-of-00002.safetensors");
  CHECK(l3::safetensors::has_safetensors_model(model));
  const SafetensorsModel loaded(model);
  CHECK(loaded.names() == std::vector<std::string>{"x", "y", "z"});
  std::vector<float> back(10);
  loaded.read("z", back);
  CHECK(back == z);
  CHECK(loaded.find("x")->shape == std::vector<std::int64_t>{10, 100});
  CHECK(loaded.find("nope") == nullptr);

  SECTION("the index names a shard that lacks the tensor") {
    std::ofstream(model + "/model.safetensors.index.json")
        << R"({"weight_map":{"x":"model-00002-of-00002.safetensors"}})";
    CHECK_THROWS_WITH(SafetensorsModel(model),
                      Catch::Contains("does not hold it") && Catch::Contains("'x'"));
  }
  SECTION("a tensor in two shards") {
    std::ofstream(model + "/model.safetensors.index.json")
        << R"({"weight_map":{"x":"model-00001-of-00002.safetensors",)"
        << R"("y":"model-00002-of-00002.safetensors"}})";
    l3::safetensors::write_safetensors(model + "/model-00002-of-00002.safetensors",
                                       {{"x", {10, 100}, x}, {"y", {1000}, y}},
                                       SafetensorsDType::f32, {});
    CHECK_THROWS_WITH(SafetensorsModel(model), Catch::Contains("a tensor in two shards"));
  }
  SECTION("a missing shard") {
    std::filesystem::remove(model + "/model-00002-of-00002.safetensors");
    CHECK_THROWS_WITH(
        SafetensorsModel(model),
        Catch::Contains("model-00002-of-00002.safetensors") && Catch::Contains("which is missing"));
  }
  SECTION("a shard name that leaves the directory") {
    std::ofstream(model + "/model.safetensors.index.json") << R"({"weight_map":{"x":"../x"}})";
    CHECK_THROWS_WITH(SafetensorsModel(model), Catch::Contains("not a file in the directory"));
  }
}

TEST_CASE("malformed safetensors files are refused with the file and the reason", "[safetensors]") {
  const l3::test::TempDir dir;
  struct Case {
    const char* name;
    std::string header;
    std::string data;
    std::optional<std::uint64_t> length;
    const char* expected;
  };
  const std::string entry_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<Case> cases = {
      {"header too long", "{}", "", std::uint64_t{200'000'000}, "over the 100 MB limit"},
      {"header past the end", "{}", "", std::uint64_t{50}, "runs past the end of the file"},
      {"truncated data", "{" + entry_a + "}", f32_bytes({1.0F}), {}, "run past the data"},
      {"overlapping offsets",
       "{" + entry_a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       f32_bytes({1.0F, 2.0F}),
       {},
       "overlaps"},
      {"a gap",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       f32_bytes({1.0F, 2.0F}),
       {},
       "belong to no tensor"},
      {"trailing bytes",
       "{" + entry_a + "}",
       f32_bytes({1.0F, 2.0F, 3.0F}),
       {},
       "at the end of the data belong to no tensor"},
      {"shape x dtype != bytes",
       R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})",
       f32_bytes({1.0F, 2.0F}),
       {},
       "is 6 bytes but data_offsets [0, 8) hold 8"},
      {"duplicate names",
       "{" + entry_a + "," + entry_a + "}",
       f32_bytes({1.0F, 2.0F}),
       {},
       "names this tensor twice"},
      {"not UTF-8", "{\"a\xff\":{}}", "", {}, "not valid UTF-8 JSON"},
      {"not JSON", "{\"a\":", "", {}, "not valid UTF-8 JSON"},
      {"not an object", "[1,2]", "", {}, "not a JSON object"},
      {"unsupported dtype",
       R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
       f32_bytes({1.0F, 2.0F}),
       {},
       "dtype I64 is not supported"},
      {"unknown dtype",
       R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})",
       f32_bytes({1.0F}),
       {},
       "unknown dtype \"Q4\""},
      {"no offsets",
       R"({"a":{"dtype":"F32","shape":[1]}})",
       f32_bytes({1.0F}),
       {},
       "has no \"data_offsets\""},
      {"negative size",
       R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
       f32_bytes({1.0F}),
       {},
       "other than sizes"},
      {"end before begin",
       R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})",
       f32_bytes({1.0F}),
       {},
       "end before they begin"},
      {"huge shape",
       R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
       f32_bytes({1.0F}),
       {},
       "too large"},
      {"metadata not strings", R"({"__metadata__":{"k":1}})", "", {}, "is not a string"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const std::string path = write_file(dir, "bad.safetensors", c.header, c.data, c.length);
    const std::string error = open_error(path);
    CHECK_THAT(error, Catch::Contains(c.expected) && Catch::Contains(path));
  }
  SECTION("too short, and empty") {
    const std::string path = (dir.path() / "short.safetensors").string();
    std::ofstream(path, std::ios::binary) << "abc";
    CHECK_THAT(open_error(path), Catch::Contains("too short"));
    { const std::ofstream empty(path, std::ios::binary | std::ios::trunc); }
    CHECK_THAT(open_error(path), Catch::Contains("too short"));
  }
  SECTION("the tensor is named where it applies") {
    const std::string path = write_file(
        dir, "t.safetensors", R"({"w.q":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})",
        f32_bytes({1.0F, 2.0F}));
    CHECK_THAT(open_error(path), Catch::Contains("'w.q'"));
  }
}
