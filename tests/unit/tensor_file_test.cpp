// Raw slice writes into a preallocated tensor file (what every rank does in a checkpoint) read
// back through the HDF5-aware reader: slices at unaligned offsets, from several writers, with
// direct I/O (where the temp file system takes it) and through the page cache.
#include "ckpt/tensor_file.hpp"

#include <array>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "../support/catch.hpp"
#include "temp_dir.hpp"

namespace {

using l3::ckpt::DatasetSpec;

std::vector<float> values(std::int64_t n, float seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = seed + 1e-3F * static_cast<float>(i % 100000);
  return v;
}

// Writes the datasets in the given slices, one writer per "rank", and reads everything back.
void round_trip(const std::string& path) {
  const std::vector<DatasetSpec> specs = {{"a", {100003}}, {"g/b", {7, 9001}}, {"c", {5}}};
  const std::vector<std::int64_t> offsets =
      l3::ckpt::create_tensor_file(path, specs, {{{"format", "test"}}, {{"version", 1}}});
  REQUIRE(offsets.size() == specs.size());
  const std::vector<std::vector<float>> data = {values(100003, 1.0F), values(63007, 2.0F),
                                                values(5, 3.0F)};
  // (dataset, first, count) per writer: boundaries that fall anywhere in a block.
  const std::vector<std::vector<std::array<std::int64_t, 3>>> writers = {
      {{0, 0, 1}, {1, 33333, 29674}},
      {{0, 1, 39999}, {2, 0, 5}},
      {{0, 40000, 60003}, {1, 0, 33333}},
  };
  for (const auto& slices : writers) {
    l3::ckpt::RawFileWriter writer(path);
    for (const auto& [set, first, count] : slices) {
      const auto& source = data[static_cast<std::size_t>(set)];
      writer.write(offsets[static_cast<std::size_t>(set)], first,
                   std::span<const float>(source).subspan(static_cast<std::size_t>(first),
                                                          static_cast<std::size_t>(count)));
    }
    writer.sync();
  }
  l3::ckpt::TensorFileReader reader(path);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::vector<float> back(data[i].size(), -1.0F);
    reader.read(specs[i].name, specs[i].shape, 0, back);
    CHECK(back == data[i]);
  }
  CHECK(reader.text_attribute("format") == "test");
}

}  // namespace

TEST_CASE("raw slice writes read back exactly, direct I/O", "[ckpt]") {
  const l3::test::TempDir dir;
  ::unsetenv("L3_CHECKPOINT_DIRECT_IO");  // NOLINT(concurrency-mt-unsafe)
  round_trip((dir.path() / "direct.h5").string());
}

TEST_CASE("raw slice writes read back exactly, through the page cache", "[ckpt]") {
  const l3::test::TempDir dir;
  ::setenv("L3_CHECKPOINT_DIRECT_IO", "0", 1);  // NOLINT(concurrency-mt-unsafe)
  round_trip((dir.path() / "buffered.h5").string());
  ::unsetenv("L3_CHECKPOINT_DIRECT_IO");  // NOLINT(concurrency-mt-unsafe)
}
