#include "io/safetensors/safetensors_writer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "io/safetensors/float_formats.hpp"

namespace l3::safetensors {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

std::int64_t numel_of(const TensorToWrite& t) {
  std::int64_t n = 1;
  for (const std::int64_t d : t.shape) n *= d;
  return n;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       SafetensorsDType dtype, const std::map<std::string, std::string>& metadata) {
  if (dtype == SafetensorsDType::f16)
    throw core::internal_error("safetensors writer: F16 is not written", {.file = path});
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const TensorToWrite& t : tensors) {
    if (!t.fill && numel_of(t) != static_cast<std::int64_t>(t.values.size())) {
      throw core::internal_error(
          fmt::format("shape holds {} elements, {} given", numel_of(t), t.values.size()),
          {.file = path, .tensor = t.name});
    }
    if (header.contains(t.name))
      throw core::internal_error("tensor written twice", {.file = path, .tensor = t.name});
    const std::uint64_t bytes = static_cast<std::uint64_t>(numel_of(t)) * dtype_bytes(dtype);
    header[t.name] = {
        {"dtype", dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  // json objects iterate in key order; the data follows the given order, which the offsets
  // record. The header is padded with spaces to a multiple of 8 (aligned data, as HF does).
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  core::AtomicFile out(path);
  std::array<char, 8> length{};
  const std::uint64_t n = text.size();
  std::memcpy(length.data(), &n, sizeof(n));
  out.write_bytes(length);
  out.write(text);
  std::vector<std::uint16_t> half;
  std::vector<float> filled;  // one tensor at a time, for tensors given by `fill`
  for (const TensorToWrite& t : tensors) {
    std::span<const float> values = t.values;
    if (t.fill) {
      filled.assign(static_cast<std::size_t>(numel_of(t)), 0.0F);
      t.fill(filled);
      values = filled;
    }
    if (dtype == SafetensorsDType::f32) {
      out.write_bytes(std::span<const char>(reinterpret_cast<const char*>(values.data()),  // NOLINT
                                            values.size_bytes()));
      continue;
    }
    constexpr std::size_t kChunk = std::size_t{1} << 20U;  // elements per conversion
    for (std::size_t i = 0; i < values.size(); i += kChunk) {
      const std::size_t n_chunk = std::min(kChunk, values.size() - i);
      half.resize(n_chunk);
      for (std::size_t j = 0; j < n_chunk; ++j) half[j] = float_to_bf16(values[i + j]);
      out.write_bytes(std::span<const char>(reinterpret_cast<const char*>(half.data()),  // NOLINT
                                            n_chunk * sizeof(std::uint16_t)));
    }
  }
  out.commit();
}

std::vector<std::string> write_safetensors_model(
    const std::string& directory, const std::vector<TensorToWrite>& tensors, SafetensorsDType dtype,
    std::uint64_t shard_bytes, const std::map<std::string, std::string>& metadata) {
  // Greedy split in order.
  std::vector<std::vector<TensorToWrite>> shards(1);
  std::uint64_t in_shard = 0;
  std::uint64_t total = 0;
  for (const TensorToWrite& t : tensors) {
    const std::uint64_t bytes = static_cast<std::uint64_t>(numel_of(t)) * dtype_bytes(dtype);
    if (!shards.back().empty() && in_shard + bytes > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += bytes;
    total += bytes;
  }
  fs::create_directories(directory);
  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_safetensors((fs::path(directory) / "model.safetensors").string(), tensors, dtype,
                      metadata);
    written.emplace_back("model.safetensors");
  } else {
    json weight_map = json::object();
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const std::string name =
          fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, shards.size());
      write_safetensors((fs::path(directory) / name).string(), shards[i], dtype, metadata);
      for (const TensorToWrite& t : shards[i]) weight_map[t.name] = name;
      written.push_back(name);
    }
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    core::write_file_atomically((fs::path(directory) / "model.safetensors.index.json").string(),
                                index.dump(2) + "\n");
    written.emplace_back("model.safetensors.index.json");
  }
  return written;
}

}  // namespace l3::safetensors
