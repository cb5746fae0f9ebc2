#include "ckpt/checksum.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include "core/error.hpp"

namespace l3::ckpt {

std::uint64_t xxh64(std::span<const std::byte> bytes, std::uint64_t seed) {
  return XXH64(bytes.data(), bytes.size(), seed);
}

std::string to_hex(std::uint64_t value) { return fmt::format("{:016x}", value); }

struct Xxh64Stream::State {
  XXH64_state_t* xxh = nullptr;
};

Xxh64Stream::Xxh64Stream(std::uint64_t seed) : state_(std::make_unique<State>()) {
  state_->xxh = XXH64_createState();
  if (state_->xxh == nullptr) throw core::internal_error("XXH64_createState failed");
  XXH64_reset(state_->xxh, seed);
}

Xxh64Stream::~Xxh64Stream() {
  if (state_ && state_->xxh != nullptr) XXH64_freeState(state_->xxh);
}

Xxh64Stream::Xxh64Stream(Xxh64Stream&&) noexcept = default;
Xxh64Stream& Xxh64Stream::operator=(Xxh64Stream&& other) noexcept {
  if (this != &other) {
    if (state_ && state_->xxh != nullptr) XXH64_freeState(state_->xxh);
    state_ = std::move(other.state_);
  }
  return *this;
}

void Xxh64Stream::update(std::span<const std::byte> bytes) {
  XXH64_update(state_->xxh, bytes.data(), bytes.size());
}

std::uint64_t Xxh64Stream::digest() const { return XXH64_digest(state_->xxh); }

}  // namespace l3::ckpt
