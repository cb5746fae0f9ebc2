#include "core/durable_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"

namespace l3::core {

namespace {
std::string errno_text() { return core::errno_text(errno); }
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

void write_file_atomically(const std::string& path, std::string_view text,
                           const std::function<void()>& before_rename) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw internal_error("cannot create file", {.file = temporary});
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) throw internal_error("cannot write file (disk full?)", {.file = temporary});
  }
  fsync_path(temporary);
  if (before_rename) before_rename();
  rename_path(temporary, path);
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  fsync_path(parent.empty() ? std::string(".") : parent.string());
}

}  // namespace l3::core
