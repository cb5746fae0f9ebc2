// Durable file operations: data reaches the disk before it is given its final name, so a crash
// never leaves a file that looks complete but is not (shards, index.json, checkpoints).
//
// Temporary names are unique ("<name>.tmp-<pid>-<n>", next to the final name) and created
// exclusively, never through a symbolic link (O_CREAT | O_EXCL | O_NOFOLLOW): a link planted under
// a temporary name makes the write fail instead of overwriting the link's target. rename(2) onto
// the final name replaces a link found there, never the file it points to; a device, a pipe, a
// socket or a directory found there is refused (bad_input), never replaced. Files that options
// name are checked first against core/output_file.hpp's stricter rule.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace l3::core {

// fsync() a file or a directory (the latter makes a rename in it durable).
void fsync_path(const std::string& path);
// rename(2), with an internal Error naming both paths on failure.
void rename_path(const std::string& from, const std::string& to);

// A new, unused temporary name next to `path`: "<path>.tmp-<pid>-<n>" (unique in this process;
// the pid makes it unique among processes of one host).
[[nodiscard]] std::string temporary_name_for(const std::string& path);
// Whether `name` (a file name, no directory) is such a temporary name.
[[nodiscard]] bool is_temporary_name(std::string_view name);

// Creates `path` exclusively (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0644 less the umask) and returns
// its descriptor, open for writing; the caller closes it. bad_input Error naming the path when it
// exists already (a file, a directory or a link: nothing is followed or truncated); internal
// Error for any other failure.
[[nodiscard]] int create_exclusive(const std::string& path);

// A file written under a fresh temporary name and moved to its final name by commit(): flushed,
// fsynced, renamed, the directory fsynced. Destroyed without commit() (an error on the way),
// the temporary is removed and the final name never touched.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  AtomicFile(AtomicFile&&) = delete;
  AtomicFile& operator=(AtomicFile&&) = delete;
  ~AtomicFile();

  [[nodiscard]] const std::string& temporary() const noexcept { return temporary_; }
  // Appends all of `bytes`; internal Error naming the temporary file (disk full, quota).
  void write_bytes(std::span<const char> bytes);
  void write(std::string_view text) {
    write_bytes(std::span<const char>(text.data(), text.size()));
  }
  // fsync, `before_rename` (a fault point, if any), rename to the final name, fsync the directory.
  void commit(const std::function<void()>& before_rename = {});

 private:
  std::string path_;
  std::string temporary_;
  int fd_ = -1;
};

// Writes `text` to `path` through an AtomicFile.
void write_file_atomically(const std::string& path, std::string_view text,
                           const std::function<void()>& before_rename = {});

}  // namespace l3::core
