#include "io/prep/gzip_reader.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/error.hpp"
#include "core/input_file.hpp"

namespace l3::prep {

namespace {
constexpr std::size_t kInputChunk = std::size_t{1} << 20U;
constexpr int kGzipWindow = 16 + MAX_WBITS;  // a gzip header and trailer around a deflate stream
}  // namespace

GzipReader::GzipReader(std::string path) : path_(std::move(path)), input_(kInputChunk) {
  fd_ = core::open_regular_file(path_, "a gzip file");
  if (inflateInit2(&stream_, kGzipWindow) != Z_OK) {
    ::close(fd_);
    throw core::internal_error("cannot start zlib", {.file = path_});
  }
}

GzipReader::~GzipReader() {
  inflateEnd(&stream_);
  if (fd_ >= 0) ::close(fd_);
}

bool GzipReader::fill() {
  while (true) {
    const ssize_t got = ::read(fd_, input_.data(), input_.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw core::bad_input(fmt::format("read error: {}", core::errno_text(errno)),
                            {.file = path_});
    stream_.next_in = input_.data();
    stream_.avail_in = static_cast<uInt>(got);
    compressed_ += static_cast<std::size_t>(got);
    return got > 0;
  }
}

std::size_t GzipReader::read(char* out, std::size_t n) {
  if (finished_ || n == 0) return 0;
  stream_.next_out = reinterpret_cast<unsigned char*>(out);  // NOLINT: zlib's byte type
  stream_.avail_out = static_cast<uInt>(std::min<std::size_t>(n, 1U << 30U));
  while (stream_.avail_out > 0) {
    if (stream_.avail_in == 0 && !fill()) {
      // The end of the file: fine between members, a cut stream inside one.
      if (in_member_) {
        throw core::bad_input("truncated gzip data: unexpected end of file", {.file = path_});
      }
      if (members_ == 0 && compressed_ > 0)
        throw core::bad_input("not gzip data (only zero bytes)", {.file = path_});
      finished_ = true;
      break;
    }
    if (!in_member_) {
      // Between members: another one (its magic), or zero padding to the end, or garbage.
      if (stream_.next_in[0] == 0) {
        const unsigned char* begin = stream_.next_in;
        const unsigned char* end = begin + stream_.avail_in;
        if (members_ > 0 && std::all_of(begin, end, [](unsigned char c) { return c == 0; })) {
          stream_.avail_in = 0;
          continue;
        }
      }
      if (members_ > 0 &&
          (stream_.next_in[0] != 0x1f || (stream_.avail_in > 1 && stream_.next_in[1] != 0x8b))) {
        throw core::bad_input("trailing data after the gzip stream (not another gzip member)",
                              {.file = path_});
      }
      in_member_ = true;
    }
    const int rc = inflate(&stream_, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      ++members_;
      in_member_ = false;
      if (inflateReset(&stream_) != Z_OK)
        throw core::internal_error("cannot reset zlib", {.file = path_});
      continue;
    }
    if (rc == Z_BUF_ERROR) continue;  // needs more input: the loop fills it
    if (rc != Z_OK) {
      throw core::bad_input(fmt::format("corrupt gzip data: {}",
                                        stream_.msg != nullptr ? stream_.msg : "inflate failed"),
                            {.file = path_});
    }
  }
  return n - stream_.avail_out;
}

}  // namespace l3::prep
