// A gzip file read as its decompressed bytes, checked to the end: every member's CRC and length
// (zlib), no member cut short, and nothing after the last member but zero padding (as GNU gzip
// accepts). zlib's gzread() takes a cut stream for the end of the file and skips trailing
// garbage silently: records would be lost, or another file's bytes appended unnoticed.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <string>
#include <vector>

namespace l3::prep {

class GzipReader {
 public:
  // bad_input Error naming `path` when it cannot be opened (or is not a regular file).
  explicit GzipReader(std::string path);
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;
  GzipReader(GzipReader&&) = delete;
  GzipReader& operator=(GzipReader&&) = delete;

  // Up to `n` decompressed bytes into `out`; 0 at the end (an empty file holds no data).
  // bad_input Error naming the file for
  // data that is not gzip, corrupt, cut short ("truncated gzip data"), or followed by anything
  // but zeros ("trailing data after the gzip stream").
  std::size_t read(char* out, std::size_t n);

 private:
  bool fill();  // more compressed input; false at the end of the file

  std::string path_;
  int fd_ = -1;
  z_stream stream_{};
  std::vector<unsigned char> input_;
  bool in_member_ = false;  // inside a member (its header may not be complete yet)
  bool finished_ = false;
  std::size_t members_ = 0;
  std::size_t compressed_ = 0;  // bytes of the file read so far (an empty file: no data, fine)
};

}  // namespace l3::prep
