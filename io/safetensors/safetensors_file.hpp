// Reading safetensors files: the header and bytes() through a read-only memory map, the values
// (read, read_range) with pread into fp32, so that reading a model holds its values, not also its
// files' pages; and Hugging Face's sharded form: model.safetensors.index.json whose "weight_map"
// names the file of every tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors/safetensors_header.hpp"

namespace l3::safetensors {

class SafetensorsFile {
 public:
  // bad_input Error naming the file when it is missing, unreadable or malformed.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&&) = delete;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] const SafetensorsHeader& header() const noexcept { return header_; }
  // The tensor's raw bytes (little-endian values of its dtype), inside the map.
  [[nodiscard]] std::span<const std::byte> bytes(const SafetensorsTensor& tensor) const;
  // The tensor converted to fp32; `out` must hold exactly its elements. bad_input Error naming
  // the file and the tensor when it is missing or the size differs.
  void read(const std::string& name, std::span<float> out) const;
  // Elements [first, first + out.size()) of the tensor (row-major), converted to fp32.
  void read_range(const std::string& name, std::int64_t first, std::span<float> out) const;

 private:
  std::string path_;
  int fd_ = -1;  // open for read_range's preads
  const std::byte* map_ = nullptr;
  std::size_t size_ = 0;
  SafetensorsHeader header_;
};

// The tensors of a Hugging Face model directory: model.safetensors.index.json and its shards,
// or a single model.safetensors. Every shard is opened and checked; the index must agree with
// the shards (every tensor it names is in its file, no tensor in two files).
class SafetensorsModel {
 public:
  explicit SafetensorsModel(const std::string& directory);

  // nullptr when absent.
  [[nodiscard]] const SafetensorsTensor* find(const std::string& name) const;
  // bad_input Error naming the file and tensor when absent or of another size.
  void read(const std::string& name, std::span<float> out) const;
  void read_range(const std::string& name, std::int64_t first, std::span<float> out) const;
  [[nodiscard]] std::vector<std::string> names() const;
  [[nodiscard]] const std::string& directory() const noexcept { return directory_; }

 private:
  std::string directory_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> owner_;  // tensor name -> its file
};

// Whether `directory` holds a model.safetensors or a model.safetensors.index.json.
[[nodiscard]] bool has_safetensors_model(const std::string& directory);

}  // namespace l3::safetensors
