#include "train/tensorboard/record_framing.hpp"

#include <algorithm>
#include <array>
#include <boost/crc.hpp>
#include <cstring>

namespace l3::train::tensorboard {

namespace {

// CRC-32C: polynomial 0x1EDC6F41, reflected, initial and final XOR all ones.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41U, 0xFFFFFFFFU, 0xFFFFFFFFU, true, true>;

constexpr std::uint32_t kMaskDelta = 0xa282ead8U;
constexpr std::size_t kLengthBytes = 8;
constexpr std::size_t kCrcBytes = 4;

template <typename T>
std::array<char, sizeof(T)> little_endian(T value) {
  std::array<char, sizeof(T)> out{};
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<char>((value >> (8 * i)) & 0xFFU);
  }
  return out;
}

template <typename T>
T from_little_endian(std::string_view bytes) {
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

std::string_view view(const std::array<char, kLengthBytes>& bytes) {
  return {bytes.data(), bytes.size()};
}

}  // namespace

std::uint32_t crc32c(std::string_view bytes) {
  Crc32c crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15U) | (crc << 17U)) + kMaskDelta;
}

std::string frame_record(std::string_view data) {
  const std::array<char, kLengthBytes> length = little_endian<std::uint64_t>(data.size());
  const std::array<char, kCrcBytes> length_crc = little_endian(masked_crc32c(view(length)));
  const std::array<char, kCrcBytes> data_crc = little_endian(masked_crc32c(data));
  std::string record;
  record.reserve(kLengthBytes + 2 * kCrcBytes + data.size());
  record.append(length.data(), length.size());
  record.append(length_crc.data(), length_crc.size());
  record.append(data);
  record.append(data_crc.data(), data_crc.size());
  return record;
}

RecordReader::Result RecordReader::next(std::string& data) {
  start_ = position_;
  std::array<char, kLengthBytes + kCrcBytes> header{};
  in_.read(header.data(), header.size());
  const auto got = static_cast<std::size_t>(in_.gcount());
  if (got == 0) return Result::end;
  if (got < header.size()) return Result::cut_short;
  const std::string_view length_bytes(header.data(), kLengthBytes);
  if (from_little_endian<std::uint32_t>(std::string_view(
          header.data() + kLengthBytes, kCrcBytes)) != masked_crc32c(length_bytes)) {
    return Result::damaged;
  }
  const auto length = from_little_endian<std::uint64_t>(length_bytes);
  // A length that passed its CRC is what the writer wrote; a read of it that comes up short is
  // a record cut short, however long the length claims.
  data.clear();
  constexpr std::uint64_t kChunk = 1U << 20U;
  for (std::uint64_t left = length; left > 0;) {
    const std::uint64_t n = std::min(left, kChunk);
    const std::size_t before = data.size();
    data.resize(before + n);
    in_.read(data.data() + before, static_cast<std::streamsize>(n));
    if (static_cast<std::uint64_t>(in_.gcount()) < n) return Result::cut_short;
    left -= n;
  }
  std::array<char, kCrcBytes> crc{};
  in_.read(crc.data(), crc.size());
  if (static_cast<std::size_t>(in_.gcount()) < crc.size()) return Result::cut_short;
  if (from_little_endian<std::uint32_t>(std::string_view(crc.data(), crc.size())) !=
      masked_crc32c(data)) {
    return Result::damaged;
  }
  position_ += header.size() + length + crc.size();
  return Result::record;
}

}  // namespace l3::train::tensorboard
