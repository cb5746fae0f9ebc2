// The files of the node-local checkpoint level (docs/FORMAT.md, "Node-local level"):
//
//   rank-00003.state   rank 3's state: a header (the checkpoint's manifest without its tensor
//                      table, rank 3's ranges, and the xxHash64 of every slice of each array, as
//                      in manifest.json) followed by its master weights, exp_avg and exp_avg_sq
//   rank-00003.copy    a partner's copy of rank 3's .state file, byte for byte, on another node
//   rank-00003.xor     rank 3's XOR parity segment for its set (ckpt/local_redundancy.hpp)
//
// Both kinds start with an 8-byte magic, the header's length and its xxHash64 (little-endian
// 64-bit), then the JSON header. A parity file ends with its segment's xxHash64. Files are
// written under a temporary name and renamed, without fsync: node-local storage does not outlive
// its node, and a file cut short by a crash of the node's kernel fails its checksums.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "ckpt/checksum.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/rank_state.hpp"
#include "model/parameter_layout.hpp"

namespace l3::ckpt {

enum class LocalFileKind : std::uint8_t { state, copy, parity };
[[nodiscard]] std::string local_file_name(LocalFileKind kind, int rank);  // "rank-00003.state"
// The kind and rank of a file name of the level; false for anything else.
[[nodiscard]] bool parse_local_file_name(std::string_view name, LocalFileKind& kind, int& rank);
[[nodiscard]] std::string_view local_kind_name(LocalFileKind kind) noexcept;

// A rank's state as the bytes of its .state file, without building them: the header, then
// views of the snapshot's arrays. The snapshot must outlive it.
class StateImage {
 public:
  // Checksums every slice (the writer's background thread builds it).
  StateImage(const model::ParameterLayout& layout, const Manifest& manifest, const RankState& state,
             int rank, int world_size, const std::string& node);
  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  // Bytes [offset, offset + out.size()), zeros past the end.
  void copy(std::int64_t offset, std::span<std::byte> out) const;
  // Writes the .state file at `path` (temporary name, then rename), over `recycle` (below).
  void write_file(const std::string& path, const std::string& recycle = {}) const;

 private:
  std::string prefix_;  // magic, lengths, header
  const RankState& state_;
  std::int64_t size_ = 0;
};

// A file written under a temporary name at any offsets, renamed to its name by commit();
// removed if destroyed before. With `recycle` naming an existing regular file (an older step's
// file of the same rank and kind, about the same size, with no other hard link), that file is
// renamed to the temporary name and written over: on tmpfs and on SSDs, writing over allocated
// pages is several times faster than allocating new ones (measured on /dev/shm: 0.19 s against 1.1
// s for 307 MB).
class LocalFileWriter {
 public:
  explicit LocalFileWriter(std::string path, const std::string& recycle = {});
  ~LocalFileWriter();
  LocalFileWriter(const LocalFileWriter&) = delete;
  LocalFileWriter& operator=(const LocalFileWriter&) = delete;
  LocalFileWriter(LocalFileWriter&&) = delete;
  LocalFileWriter& operator=(LocalFileWriter&&) = delete;
  void write_at(std::int64_t offset, std::span<const std::byte> bytes);
  void truncate(std::int64_t size);
  void commit();

 private:
  std::string path_;
  std::string temporary_;
  int fd_ = -1;
};

// Writes a parity file's header (the set, the members' state sizes, the chunk size) in the
// constructor, then its segment piece by piece in order, then commit() appends the checksum.
class ParityFileWriter {
 public:
  ParityFileWriter(const std::string& path, const nlohmann::json& header,
                   const std::string& recycle = {});
  void append(std::span<const std::byte> bytes);
  void commit();

 private:
  LocalFileWriter file_;
  std::int64_t at_ = 0;
  Xxh64Stream hash_;
};

// What a local file says about itself, once checked.
struct LocalFileCheck {
  bool ok = false;
  std::string problem;  // one line, naming the file
  nlohmann::json header;
  std::int64_t bytes = 0;           // the file's size
  std::int64_t payload_offset = 0;  // where the arrays (state) or the segment (parity) start
};
// checksums = false: magic, header checksum and size only; true: every slice (state, copy) or
// the segment (parity) too.
[[nodiscard]] LocalFileCheck check_local_file(const std::string& path, bool checksums);

// Reads a checked .state/.copy file whole: the manifest it carries and the rank's state, every
// slice checked against its checksum. bad_input Error naming the file otherwise.
struct LocalState {
  Manifest manifest;
  RankState state;
  int rank = 0;
  int world_size = 0;
};
[[nodiscard]] LocalState read_local_state(const std::string& path);

// Reads `out.size()` bytes at `offset` of `path` (zeros past its end). internal Error naming
// the file on a read failure.
void read_file_bytes(const std::string& path, std::int64_t offset, std::span<std::byte> out);

}  // namespace l3::ckpt
