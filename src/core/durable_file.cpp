#include "core/durable_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "core/error.hpp"

namespace l3::core {

namespace {

std::string errno_text() { return core::errno_text(errno); }

constexpr std::string_view kTemporaryMark = ".tmp-";

// Whether `text` is one or more decimal digits.
bool all_digits(std::string_view text) {
  if (text.empty()) return false;
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

}  // namespace

void fsync_path(const std::string& path) {
  const int fd =
      ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // NOLINT(cppcoreguidelines-pro-type-vararg)
  if (fd < 0)
    throw internal_error(fmt::format("cannot open to fsync: {}", errno_text()), {.file = path});
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0 && saved != EINVAL) {  // some file systems cannot fsync directories: harmless
    errno = saved;
    throw internal_error(fmt::format("fsync failed: {}", errno_text()), {.file = path});
  }
}

void rename_path(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    throw internal_error(fmt::format("cannot rename to {}: {}", to, errno_text()), {.file = from});
  }
}

std::string temporary_name_for(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
  return fmt::format("{}{}{}-{}", path, kTemporaryMark, ::getpid(), counter++);
}

bool is_temporary_name(std::string_view name) {
  const std::size_t mark = name.rfind(kTemporaryMark);
  if (mark == std::string_view::npos || mark == 0) return false;
  const std::string_view tail = name.substr(mark + kTemporaryMark.size());
  const std::size_t dash = tail.find('-');
  return dash != std::string_view::npos && all_digits(tail.substr(0, dash)) &&
         all_digits(tail.substr(dash + 1));
}

int create_exclusive(const std::string& path) {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd >= 0) return fd;
  if (errno == EEXIST) {
    throw bad_input(
        "exists already (a file, directory or symbolic link llama3-hpc did not create here): "
        "not overwritten",
        {.file = path});
  }
  // What the path or its directory makes impossible: the user's to fix (exit 2).
  if (errno == EACCES || errno == EPERM || errno == EROFS || errno == ENOENT || errno == ENOTDIR ||
      errno == ENAMETOOLONG || errno == ELOOP || errno == EISDIR) {
    throw bad_input(fmt::format("cannot create: {}", errno_text()), {.file = path});
  }
  throw internal_error(fmt::format("cannot create: {}", errno_text()), {.file = path});
}

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), temporary_(temporary_name_for(path_)) {
  fd_ = create_exclusive(temporary_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temporary_.empty()) ::unlink(temporary_.c_str());  // not committed: leave nothing behind
}

void AtomicFile::write_bytes(std::span<const char> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw internal_error(fmt::format("cannot write (disk full?): {}",
                                       n < 0 ? errno_text() : std::string("no progress")),
                           {.file = temporary_});
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

void AtomicFile::commit(const std::function<void()>& before_rename) {
  if (::fsync(fd_) != 0 && errno != EINVAL) {
    throw internal_error(fmt::format("fsync failed: {}", errno_text()), {.file = temporary_});
  }
  if (::close(std::exchange(fd_, -1)) != 0) {
    throw internal_error(fmt::format("cannot close (disk full?): {}", errno_text()),
                         {.file = temporary_});
  }
  if (before_rename) before_rename();
  // A rename replaces whatever has the final name: never a device, a pipe, a socket or a
  // directory (as root, a rename onto /dev/sda's name would remove the device node).
  struct stat info {};
  if (::lstat(path_.c_str(), &info) == 0 && !S_ISREG(info.st_mode) && !S_ISLNK(info.st_mode)) {
    throw bad_input(
        "exists and is not a regular file: not replaced (llama3-hpc replaces only "
        "regular files it writes)",
        {.file = path_});
  }
  rename_path(temporary_, path_);
  temporary_.clear();
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  fsync_path(parent.empty() ? std::string(".") : parent.string());
}

void write_file_atomically(const std::string& path, std::string_view text,
                           const std::function<void()>& before_rename) {
  AtomicFile file(path);
  file.write(text);
  file.commit(before_rename);
}

}  // namespace l3::core
