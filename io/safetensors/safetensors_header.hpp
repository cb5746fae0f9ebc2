// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of UTF-8 JSON, then the data buffer. The JSON maps each tensor name
// to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data buffer)
// and may hold "__metadata__" (string to string). This parser checks everything a reader relies
// on before any data is touched: header size (at most 100 MB, within the file), valid UTF-8
// JSON without duplicate names, known dtypes (BF16, F16, F32; the others are refused by name),
// shape x dtype size == the byte range, ranges inside the buffer that tile it exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace l3::safetensors {

enum class SafetensorsDType { bf16, f16, f32 };

[[nodiscard]] std::size_t dtype_bytes(SafetensorsDType dtype) noexcept;
[[nodiscard]] const char* dtype_name(SafetensorsDType dtype) noexcept;  // "BF16", ...

struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte range within the data buffer
  std::uint64_t end = 0;
  [[nodiscard]] std::int64_t numel() const noexcept;
};

struct SafetensorsHeader {
  std::uint64_t data_start = 0;  // 8 + header length: where the data buffer begins in the file
  std::vector<SafetensorsTensor> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  [[nodiscard]] const SafetensorsTensor* find(const std::string& name) const noexcept;
};

inline constexpr std::uint64_t kMaxSafetensorsHeader = 100'000'000;

// `prefix`: the file's first bytes (at least 8 + the header length, when the file has them);
// `file_size`: the whole file's size. bad_input Errors name `origin` and, where it applies, the
// tensor.
[[nodiscard]] SafetensorsHeader parse_safetensors_header(std::span<const std::byte> prefix,
                                                         std::uint64_t file_size,
                                                         const std::string& origin);

}  // namespace l3::safetensors
