// xxHash64 checksums of checkpoint data (xxhash library): fast enough (~10 GB/s per core) to
// checksum every slice as it is written and to verify whole checkpoints before resuming.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace l3::ckpt {

[[nodiscard]] std::uint64_t xxh64(std::span<const std::byte> bytes, std::uint64_t seed = 0);
[[nodiscard]] std::string to_hex(std::uint64_t value);  // 16 lowercase hex digits

// A running xxHash64 over pieces fed in order (the digest of a whole tensor read in slices).
class Xxh64Stream {
 public:
  explicit Xxh64Stream(std::uint64_t seed = 0);
  ~Xxh64Stream();
  Xxh64Stream(const Xxh64Stream&) = delete;
  Xxh64Stream& operator=(const Xxh64Stream&) = delete;
  Xxh64Stream(Xxh64Stream&&) noexcept;
  Xxh64Stream& operator=(Xxh64Stream&&) noexcept;
  void update(std::span<const std::byte> bytes);
  [[nodiscard]] std::uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace l3::ckpt
