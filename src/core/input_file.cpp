#include "core/input_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.hpp"

namespace l3::core {

namespace {

// What a file of this mode is, for a message; "" for a regular file.
std::string_view kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

Error not_regular(const std::string& path, std::string_view kind, std::string_view what) {
  return bad_input(fmt::format("is {}, not {}; inputs must be regular files", kind, what),
                   {.file = path});
}

}  // namespace

void require_regular_file(const std::string& path, std::string_view what) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return;
  if (const std::string_view kind = kind_of(info.st_mode); !kind.empty())
    throw not_regular(path, kind, what);
}

int open_regular_file(const std::string& path, std::string_view what) {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int error = errno;
    if (error == ENXIO) throw not_regular(path, "a socket or a device without a reader", what);
    throw bad_input(fmt::format("cannot read: {}", errno_text(error)), {.file = path});
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    throw bad_input(fmt::format("cannot look at: {}", errno_text(error)), {.file = path});
  }
  if (const std::string_view kind = kind_of(info.st_mode); !kind.empty()) {
    ::close(fd);
    throw not_regular(path, kind, what);
  }
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
  const int flags = ::fcntl(fd, F_GETFL);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int error = errno;
    ::close(fd);
    throw internal_error(fmt::format("cannot set blocking reads: {}", errno_text(error)),
                         {.file = path});
  }
  return fd;
}

}  // namespace l3::core
