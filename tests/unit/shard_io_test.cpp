#include <hdf5.h>

#include <filesystem>
#include <fstream>

#include "catch.hpp"
#include "core/error.hpp"
#include "io/data/shard_format.hpp"
#include "io/h5/h5.hpp"
#include "temp_dir.hpp"

using l3::data::Documents;
using l3::data::ShardAttributes;

namespace {
std::string failure_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const l3::core::Error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("SFT and preference shards round-trip, written atomically", "[shards]") {
  const l3::test::TempDir dir;
  Documents d;
  d.add(std::vector<std::int32_t>{1, 2, 3}, std::vector<std::uint8_t>{0, 1, 1});
  d.add(std::vector<std::int32_t>{128255, 7}, std::vector<std::uint8_t>{0, 1});
  const ShardAttributes attrs{"llama3-hpc/sft", 1, "abc123", 128256};
  const std::string path = (dir.path() / "s.h5").string();
  l3::data::write_sft_shard(path, d, attrs);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  const auto shard = l3::data::read_sft_shard(path);
  CHECK(shard.attributes.format == "llama3-hpc/sft");
  CHECK(shard.attributes.tokenizer_sha256 == "abc123");
  CHECK(shard.attributes.vocab_size == 128256);
  CHECK(shard.documents.tokens == d.tokens);
  CHECK(shard.documents.loss_mask == d.loss_mask);
  CHECK(shard.documents.offsets == std::vector<std::int64_t>{0, 3, 5});
  CHECK(shard.documents.loss_tokens() == 3);

  l3::data::PreferencePairs p;
  p.chosen.add(std::vector<std::int32_t>{5, 6}, {});
  p.rejected.add(std::vector<std::int32_t>{5, 7, 8}, {});
  p.margins = {0.5F};
  p.has_margin = true;
  const std::string pref = (dir.path() / "p.h5").string();
  l3::data::write_preference_shard(pref, p, {"llama3-hpc/preference", 1, "abc123", 512});
  const auto back = l3::data::read_preference_shard(pref);
  CHECK(back.pairs.count() == 1);
  CHECK(back.pairs.rejected.tokens == std::vector<std::uint32_t>{5, 7, 8});
  CHECK(back.pairs.margins == std::vector<float>{0.5F});
  // reading one kind as the other is an error naming the file
  CHECK(failure_of([&] { (void)l3::data::read_sft_shard(pref); }) ==
        pref + ": format is \"llama3-hpc/preference\", expected \"llama3-hpc/sft\"");
}

TEST_CASE("corrupt shards are clear errors naming the file and dataset", "[shards]") {
  const l3::test::TempDir dir;
  Documents d;
  d.add(std::vector<std::int32_t>(1000, 42), std::vector<std::uint8_t>(1000, 1));
  const std::string good = (dir.path() / "good.h5").string();
  l3::data::write_sft_shard(good, d, {"llama3-hpc/sft", 1, "x", 512});

  // truncated file
  const std::string truncated = (dir.path() / "truncated.h5").string();
  std::filesystem::copy_file(good, truncated);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(good) / 2);
  CHECK(
      failure_of([&] { (void)l3::data::read_sft_shard(truncated); }).starts_with(truncated + ": "));

  // not HDF5 at all
  const std::string text = dir.write("text.h5", "hello");
  CHECK(failure_of([&] { (void)l3::data::read_sft_shard(text); }).find("cannot open as HDF5") !=
        std::string::npos);

  // offsets past the end, wrong dtype, future version
  const std::string bad = (dir.path() / "bad.h5").string();
  {
    const auto file = l3::h5::create_file(bad);
    l3::h5::write_attribute(file, "format", "llama3-hpc/sft", bad);
    l3::h5::write_attribute(file, "version", std::int64_t{1}, bad);
    l3::h5::write_attribute(file, "tokenizer_sha256", "x", bad);
    l3::h5::write_attribute(file, "vocab_size", std::int64_t{512}, bad);
    l3::h5::write_dataset<std::uint32_t>(file, "tokens", std::vector<std::uint32_t>{1, 2}, bad);
    l3::h5::write_dataset<std::uint8_t>(file, "loss_mask", std::vector<std::uint8_t>{1, 1}, bad);
    l3::h5::write_dataset<std::int64_t>(file, "doc_offsets", std::vector<std::int64_t>{0, 5}, bad);
  }
  CHECK(failure_of([&] { (void)l3::data::read_sft_shard(bad); }) ==
        bad + ": tensor '/doc_offsets': offsets must run from 0 to the token count 2");
  const std::string dtype = (dir.path() / "dtype.h5").string();
  {
    const auto file = l3::h5::create_file(dtype);
    l3::h5::write_attribute(file, "format", "llama3-hpc/sft", dtype);
    l3::h5::write_attribute(file, "version", std::int64_t{1}, dtype);
    l3::h5::write_attribute(file, "tokenizer_sha256", "x", dtype);
    l3::h5::write_attribute(file, "vocab_size", std::int64_t{512}, dtype);
    l3::h5::write_dataset<std::int64_t>(file, "tokens", std::vector<std::int64_t>{1, 2}, dtype);
  }
  CHECK(failure_of([&] {
          (void)l3::data::read_sft_shard(dtype);
        }).find("tensor 'tokens': wrong element type") != std::string::npos);
  // A dataset that declares 2^40 tokens and stores none (HDF5 would fill them in): refused by
  // its stored size before anything is allocated.
  const std::string hollow = (dir.path() / "hollow.h5").string();
  {
    const auto file = l3::h5::create_file(hollow);
    l3::h5::write_attribute(file, "format", "llama3-hpc/sft", hollow);
    l3::h5::write_attribute(file, "version", std::int64_t{1}, hollow);
    l3::h5::write_attribute(file, "tokenizer_sha256", "x", hollow);
    l3::h5::write_attribute(file, "vocab_size", std::int64_t{512}, hollow);
    const hsize_t huge[1] = {hsize_t{1} << 40U};
    const l3::h5::Handle space(H5Screate_simple(1, huge, nullptr), H5Sclose);
    const l3::h5::Handle set(H5Dcreate2(file.get(), "tokens", H5T_NATIVE_UINT32, space.get(),
                                        H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                             H5Dclose);
    REQUIRE(set.valid());
  }
  CHECK(failure_of([&] { (void)l3::data::read_sft_shard(hollow); }) ==
        hollow +
            ": tensor 'tokens': declares 1099511627776 elements but stores 0 bytes (a "
            "damaged file)");
  const std::string future = (dir.path() / "future.h5").string();
  l3::data::write_sft_shard(future, d, {"llama3-hpc/sft", 99, "x", 512});
  CHECK(failure_of([&] {
          (void)l3::data::read_sft_shard(future);
        }).find("version 99 is not supported") != std::string::npos);
}
