// TensorBoard's record framing (TensorFlow's TFRecord format), in which event files store
// serialized Event messages one after another:
//
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes |
//   length bytes of data          | uint32 masked CRC32C of the data
//
// The mask, ((crc >> 15) | (crc << 17)) + 0xa282ead8, keeps a CRC of data that itself holds
// CRCs from being trivially valid. A reader checks both CRCs, so a record cut short by a killed
// writer or damaged on disk is recognised, never misread.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <string_view>

namespace l3::train::tensorboard {

// CRC-32C (Castagnoli) of `bytes`.
[[nodiscard]] std::uint32_t crc32c(std::string_view bytes);
// The masked form stored in records.
[[nodiscard]] std::uint32_t masked_crc32c(std::string_view bytes);

// `data` framed as one record.
[[nodiscard]] std::string frame_record(std::string_view data);

// Reads the records of a stream in order.
class RecordReader {
 public:
  enum class Result {
    record,     // a whole record, both CRCs right
    end,        // the stream ended at a record boundary
    cut_short,  // the stream ended inside a record (a writer killed while writing it)
    damaged,    // a CRC does not match: nothing after this point can be trusted
  };
  explicit RecordReader(std::istream& in) : in_(in) {}
  // The next record into `data`; `offset()` is then where the record started.
  Result next(std::string& data);
  [[nodiscard]] std::uint64_t offset() const noexcept { return start_; }

 private:
  std::istream& in_;
  std::uint64_t start_ = 0;
  std::uint64_t position_ = 0;
};

}  // namespace l3::train::tensorboard
