// The one rule for a file that an option names as an output (generate --output and its
// .partial/.progress files, --metrics, --log-completions, report --output, TensorBoard's event
// files): what is there is a regular file with one name, or nothing yet. Anything else is
// refused with one line naming it (exit 2) before anything is written:
//
// - a symbolic link, even to a regular file: nothing is written through a link we did not create;
// - a directory, a device, a named pipe (FIFO) or a socket: a rename onto a device would replace
//   it (as root, a system device), and writing into one never ends or blocks;
// - a regular file with a second hard link: writing in place would change the other name too.
//
// (Whole directories follow core/path_safety.hpp; inputs follow core/input_file.hpp.)
#pragma once

#include <string>
#include <string_view>

namespace l3::core {

// Why `path` may not be written as an output file (a phrase: "is a symbolic link", "is a
// character device", "has 2 hard links"), or "" when it is a regular file with one name or
// nothing is there.
[[nodiscard]] std::string why_not_output_file(const std::string& path);

// bad_input Error (exit 2) naming `option` and `path` unless why_not_output_file() is "".
void require_output_file(const std::string& path, std::string_view option);

// Opens `path` to append to (and read: a log checks what it holds), creating it (mode 0644 less the
// umask) when missing, and returns the descriptor (the caller closes it). Never through a link
// (O_NOFOLLOW), never blocking on a FIFO (opened non-blocking, then set back): what it opened is
// checked with fstat against the rule above, so a file swapped in between the check and the open is
// refused too. bad_input Error naming `option` and the path otherwise.
[[nodiscard]] int open_output_for_append(const std::string& path, std::string_view option);

// An output file open for appending (open_output_for_append), closed when destroyed.
class AppendedFile {
 public:
  AppendedFile(std::string path, std::string_view option);
  AppendedFile(const AppendedFile&) = delete;
  AppendedFile& operator=(const AppendedFile&) = delete;
  AppendedFile(AppendedFile&&) = delete;
  AppendedFile& operator=(AppendedFile&&) = delete;
  ~AppendedFile();

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] int descriptor() const noexcept { return fd_; }
  // Appends all of `text`; internal Error naming the file (disk full, quota).
  void append(std::string_view text);
  // The data on the disk (fsync).
  void sync();

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace l3::core
