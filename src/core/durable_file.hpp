// Durable file operations: data reaches the disk before it is given its final name, so a crash
// never leaves a file that looks complete but is not (shards, index.json, checkpoints).
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace l3::core {

// fsync() a file or a directory (the latter makes a rename in it durable).
void fsync_path(const std::string& path);
// Writes `text` to path + ".tmp", fsyncs it, calls `before_rename` (if any: a fault point),
// renames it to path, fsyncs the directory.
void write_file_atomically(const std::string& path, std::string_view text,
                           const std::function<void()>& before_rename = {});
// rename(2), with an internal Error naming both paths on failure.
void rename_path(const std::string& from, const std::string& to);

}  // namespace l3::core
