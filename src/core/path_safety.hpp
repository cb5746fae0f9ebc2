// The one place that decides what llama3-hpc may create, replace or remove on disk (docs/CLI.md,
// "What llama3-hpc writes, replaces and removes"):
//
// - A directory named by an option is taken as absolute and lexically normal ("out/", "out/."
//   and "./out" are one directory) and may never be the root, the current directory or one that
//   holds it.
// - A directory is replaced (--overwrite) or emptied only when what it holds proves that
//   llama3-hpc wrote it (OwnedKind): its marker, and no entry of a kind we never write. An empty
//   directory holds nothing to lose and counts as ours.
// - Whole directories are built in a staging directory next to the target, created exclusively
//   under a name no other process uses, and renamed into place when complete.
// - Removal never follows a symbolic link: a link is removed itself, its target left alone.
// - Files are created exclusively (core/durable_file.hpp): nothing is written through a link we
//   did not create.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace l3::core {

namespace fs = std::filesystem;

// The directories llama3-hpc writes whole, and how it recognises one it wrote.
enum class OwnedKind {
  dataset,    // prep: index.json of format "llama3-hpc/...", part-*.h5; or train/ and val/ of those
  hf_export,  // export: config.json with a "llama3_hpc" entry, safetensors, tokenizer files
  peft_adapter,  // a LoRA adapter: adapter_config.json ("peft_type": "LORA"), its safetensors
                 // with kAdapterMetadataKey in its metadata
};

// The key in the "__metadata__" of the adapter_model.safetensors that llama3-hpc writes: what
// proves an adapter directory ours (PEFT ignores metadata; adapter_config.json cannot carry a
// key of ours, which PEFT up to 0.13 refuses).
inline constexpr const char* kAdapterMetadataKey = "llama3_hpc";

// A directory named on the command line by `option` (for messages, e.g. "--output"), absolute
// and lexically normal without a trailing separator. usage Error for an empty value, the root
// directory, and the current directory or a directory that holds it (compared after resolving
// links, so "../w" from inside w is caught).
[[nodiscard]] fs::path output_directory(std::string_view option, const std::string& value);

// Why `dir` is not a directory llama3-hpc wrote as `kind` (a sentence naming the entry that
// proves it), or "" when it is.
[[nodiscard]] std::string why_not_ours(const fs::path& dir, OwnedKind kind);
// bad_input Error naming `dir` (exit 2) unless why_not_ours() is "".
void require_ours(const fs::path& dir, OwnedKind kind, std::string_view option);

// An entry a command writes into a directory of its own (the demo's --workdir).
struct KnownEntry {
  std::string_view name;
  bool directory = false;  // else a regular file
};
// Why `dir` holds an entry that is not one of `known` with its type (a sentence naming it;
// `owner` says who writes the others: "the demo"), or "". Links never count as known.
[[nodiscard]] std::string unknown_entry(const fs::path& dir, std::span<const KnownEntry> known,
                                        std::string_view owner);
// The content of a small regular file (not a link), or "" when there is none or it cannot be
// read: for markers.
[[nodiscard]] std::string read_small_regular_file(const fs::path& file);

// Whether something is at `path` (a link counts, even a dangling one: nothing is followed).
[[nodiscard]] bool entry_exists(const fs::path& path);
// Whether `path` is a directory itself, not a link to one.
[[nodiscard]] bool is_real_directory(const fs::path& path);

// Removes `path` with everything under it; a symbolic link is removed, never followed. Error
// naming the path otherwise (bad_input when permissions or a read-only file system refuse it,
// internal for other failures). Nothing there: nothing done.
void remove_tree(const fs::path& path);

// A directory of the program's own inside one it owns (a node-local step directory): created
// when missing; a symbolic link found there (planted: the program never makes one) is removed
// itself, never followed, and a real directory made in its place. bad_input Error naming
// `option` and the path when something else is there or it cannot be created. Safe when several
// processes make the same directory at once.
void make_real_directory(const fs::path& dir, std::string_view option);
// bad_input Error naming `option` when `path` is a symbolic link: the program never writes
// through a link it did not create.
void refuse_link(const fs::path& path, std::string_view option);

// Makes sure new files can be created in `dir` now: creates it (and its parents) when missing,
// then creates and removes a probe file. bad_input Error naming the option, `dir` and the reason.
void check_writable_directory(const fs::path& dir, std::string_view option);

// The name of this host, as staging directory names record it ("" when unknown).
[[nodiscard]] std::string host_name();

// A directory that becomes `target` once complete: "<target>.partial-<host>-<pid>-<n>" next to
// it, created exclusively (never one that exists, never through a link), holding a marker file
// (".llama3-hpc-staging") that names the directory, its host and its process until install()
// removes it. The target's parent is created when missing; bad_input naming it when it cannot
// be created or written. Destroyed before install(), the staging directory is removed with all
// it holds.
class StagingDirectory {
 public:
  StagingDirectory(fs::path target, OwnedKind kind, std::string option);
  StagingDirectory(const StagingDirectory&) = delete;
  StagingDirectory& operator=(const StagingDirectory&) = delete;
  StagingDirectory(StagingDirectory&&) = delete;
  StagingDirectory& operator=(StagingDirectory&&) = delete;
  ~StagingDirectory();

  [[nodiscard]] const fs::path& path() const noexcept { return path_; }
  [[nodiscard]] const fs::path& target() const noexcept { return target_; }
  // Moves the staging directory to the target. An existing target is replaced only with
  // `replace` and only when it is ours (checked again now): it is moved into a new marked
  // directory ("<target>.old-<host>-<pid>-<n>/<target's name>"), the staging directory renamed
  // in, the parent fsynced, and the old one removed.
  void install(bool replace);

 private:
  fs::path target_;
  OwnedKind kind_;
  std::string option_;
  fs::path path_;
  bool installed_ = false;
};

// Removes the staging and set-aside directories of `target` ("<target>.partial-..." and
// "<target>.old-...") that processes of this host left behind when they were killed: their
// process is gone, and their marker names them, this host and that process. Nothing is removed
// by its name alone: without such a marker (a user's "out.old-2024-06", a copy, an earlier
// version's), another host's, a live process's, or a link, it is left alone. Returns the names
// removed.
std::vector<std::string> remove_abandoned_staging(const fs::path& target);

// The directory an exporter writes (`option`, e.g. "--output", names it), checked before any
// work: output_directory's checks; when it exists, a usage Error without `overwrite`, and
// require_ours with it; then this host's abandoned staging directories of it removed.
[[nodiscard]] fs::path replaceable_output(std::string_view option, const std::string& value,
                                          OwnedKind kind, bool overwrite);

}  // namespace l3::core
