#include "core/output_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "core/error.hpp"

namespace l3::core {

namespace {

// Why a file with this status may not be written as an output, or "".
std::string why_not(const struct stat& info) {
  if (S_ISLNK(info.st_mode)) return "is a symbolic link";
  if (S_ISDIR(info.st_mode)) return "is a directory";
  if (S_ISFIFO(info.st_mode)) return "is a named pipe (FIFO)";
  if (S_ISCHR(info.st_mode)) return "is a character device";
  if (S_ISBLK(info.st_mode)) return "is a block device";
  if (S_ISSOCK(info.st_mode)) return "is a socket";
  if (!S_ISREG(info.st_mode)) return "is not a regular file";
  if (info.st_nlink > 1) return fmt::format("has {} hard links", info.st_nlink);
  return "";
}

Error refused(const std::string& path, std::string_view option, std::string_view why) {
  return bad_input(fmt::format("{} ({}): an output must be a regular file with one name, or "
                               "not exist yet (llama3-hpc never writes through a link, into a "
                               "device or a pipe, or onto a file that has other names)",
                               why, option),
                   {.file = path});
}

}  // namespace

std::string why_not_output_file(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return "";  // nothing there (or the write says why)
  return why_not(info);
}

void require_output_file(const std::string& path, std::string_view option) {
  if (const std::string why = why_not_output_file(path); !why.empty())
    throw refused(path, option, why);
}

int open_output_for_append(const std::string& path, std::string_view option) {
  require_output_file(path, option);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
  const int fd =
      ::open(path.c_str(),
             O_RDWR | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    if (error == ELOOP) throw refused(path, option, "is a symbolic link");
    if (error == ENXIO) throw refused(path, option, "is a device or a pipe without a reader");
    if (error == EISDIR) throw refused(path, option, "is a directory");
    throw bad_input(fmt::format("{}: cannot open to append: {}", option, errno_text(error)),
                    {.file = path});
  }
  struct stat info {};
  std::string why = ::fstat(fd, &info) == 0 ? why_not(info) : "cannot be looked at";
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
  const int flags = why.empty() ? ::fcntl(fd, F_GETFL) : -1;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
  if (why.empty() && (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0))
    why = "cannot be set to blocking writes";
  if (!why.empty()) {
    ::close(fd);
    throw refused(path, option, why);
  }
  return fd;
}

AppendedFile::AppendedFile(std::string path, std::string_view option)
    : path_(std::move(path)), fd_(open_output_for_append(path_, option)) {}

AppendedFile::~AppendedFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendedFile::append(std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd_, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw internal_error(fmt::format("cannot write (disk full?): {}",
                                       n < 0 ? errno_text(errno) : std::string("no progress")),
                           {.file = path_});
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

void AppendedFile::sync() {
  if (::fsync(fd_) != 0 && errno != EINVAL)
    throw internal_error(fmt::format("fsync failed: {}", errno_text(errno)), {.file = path_});
}

}  // namespace l3::core
