// HDF5 files of fp32 tensors written by many ranks at once without parallel HDF5: rank 0
// creates the file with every dataset contiguous and its storage allocated up front (never
// filled), and learns where each dataset's data starts in the file; then every rank writes its
// slices straight to those bytes with pwrite. The result is an ordinary HDF5 file (h5py reads
// it), written at the speed of the file system, with no collective HDF5 call on a background
// thread. Readers use the same offsets when the layout is still contiguous little-endian fp32,
// and fall back to HDF5 otherwise (a file repacked with compression still reads).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace l3::ckpt {

struct DatasetSpec {
  std::string name;  // may contain '/' (a group path): groups are created
  std::vector<std::int64_t> shape;
};

struct FileAttributes {
  std::vector<std::pair<std::string, std::string>> text;
  std::vector<std::pair<std::string, std::int64_t>> integers;
};

// Creates `path`, which must not exist (it is created exclusively, never through a link: the
// checkpoint writer makes it in the step's fresh .partial directory), with the datasets and root
// attributes; returns each dataset's byte offset in the file, in the order given. Error naming
// the file on failure.
[[nodiscard]] std::vector<std::int64_t> create_tensor_file(const std::string& path,
                                                           const std::vector<DatasetSpec>& sets,
                                                           const FileAttributes& attributes);

// Raw writes into a file made by create_tensor_file.
//
// Direct I/O where the file system allows it: the 4 KiB-aligned middle of each write goes
// through O_DIRECT from an aligned staging buffer, the unaligned ends (and everything, where
// O_DIRECT is refused, e.g. tmpfs) through the page cache. Why: ranks write their slices into
// the same two files, and buffered writes to one file serialise on its inode lock (ext4, XFS)
// and spend CPU copying into the page cache, which the training then waits for; direct writes
// of whole blocks run in parallel with no page-cache copy. No page is written both ways (the
// ends' pages are never part of a direct write), so the two paths stay coherent.
// L3_CHECKPOINT_DIRECT_IO=0 turns it off.
class RawFileWriter {
 public:
  explicit RawFileWriter(const std::string& path);
  ~RawFileWriter();
  RawFileWriter(const RawFileWriter&) = delete;
  RawFileWriter& operator=(const RawFileWriter&) = delete;
  RawFileWriter(RawFileWriter&&) = delete;
  RawFileWriter& operator=(RawFileWriter&&) = delete;
  // values at element `first` of the dataset whose data starts at `dataset_offset`.
  void write(std::int64_t dataset_offset, std::int64_t first, std::span<const float> values);
  // fsync; errors (EIO, ENOSPC surfacing late) are internal Errors naming the file.
  void sync();

 private:
  struct FreeDeleter {
    void operator()(void* p) const noexcept;
  };
  void write_buffered(const char* bytes, std::size_t size, off_t at);
  // Falls back to buffered writes for good if the file system refuses (EINVAL).
  void write_direct(const char* bytes, std::size_t size, off_t at);

  std::string path_;
  int fd_ = -1;
  int direct_fd_ = -1;  // the same file opened with O_DIRECT, or -1
  std::unique_ptr<char, FreeDeleter> staging_;
};

// Reads ranges of fp32 tensors.
class TensorFileReader {
 public:
  // bad_input Error naming the file when it is missing or not HDF5.
  explicit TensorFileReader(const std::string& path);
  ~TensorFileReader();
  TensorFileReader(const TensorFileReader&) = delete;
  TensorFileReader& operator=(const TensorFileReader&) = delete;
  TensorFileReader(TensorFileReader&&) = delete;
  TensorFileReader& operator=(TensorFileReader&&) = delete;

  // Elements [first, first + out.size()) of dataset `name`, which must have `shape`.
  // bad_input Errors name the file and the tensor.
  void read(const std::string& name, std::span<const std::int64_t> shape, std::int64_t first,
            std::span<float> out);
  [[nodiscard]] std::string text_attribute(const std::string& name) const;
  [[nodiscard]] std::int64_t integer_attribute(const std::string& name) const;
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  struct Dataset {
    std::vector<std::int64_t> shape;
    std::int64_t offset = -1;  // byte offset of contiguous little-endian fp32 data, else -1
  };
  const Dataset& dataset(const std::string& name);

  std::string path_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace l3::ckpt
