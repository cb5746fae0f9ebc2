// Consecutive 256-byte aligned pieces of one scratch buffer: an op reserves what it needs, asks
// the buffer for total() bytes, then finds each piece at its offset.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace l3::cuda {

class Carver {
 public:
  template <typename T>
  std::size_t reserve(std::int64_t count) {
    return reserve_bytes(static_cast<std::size_t>(std::max<std::int64_t>(count, 1)) * sizeof(T));
  }
  std::size_t reserve_bytes(std::size_t bytes) {
    const std::size_t at = used_;
    used_ += (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
    return at;
  }
  [[nodiscard]] std::size_t total() const { return used_; }

 private:
  std::size_t used_ = 0;
};

template <typename T>
T* at(void* base, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);  // NOLINT: carved scratch
}

}  // namespace l3::cuda
