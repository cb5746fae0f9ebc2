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
#include <string>
#include <string_view>
#include <vector>

namespace l3::core {

namespace fs = std::filesystem;

// The directories llama3-hpc writes whole, and how it recognises one it wrote.
enum class OwnedKind {
  dataset,    // prep: index.json of format "llama3-hpc/...", part-*.h5; or train/ and val/ of those
  hf_export,  // export: config.json with a "llama3_hpc" entry, safetensors, tokenizer files
  demo,       // demo --workdir: the marker .llama3-hpc-demo, input/, sft/, preferences/, ckpt/
  peft_adapter,  // a LoRA adapter: adapter_config.json ("peft_type": "LORA"), its safetensors
};

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

// Whether something is at `path` (a link counts, even a dangling one: nothing is followed).
[[nodiscard]] bool entry_exists(const fs::path& path);
// Whether `path` is a directory itself, not a link to one.
[[nodiscard]] bool is_real_directory(const fs::path& path);

// Removes `path` with everything under it; a symbolic link is removed, never followed. Error
// naming the path otherwise (bad_input when permissions or a read-only file system refuse it,
// internal for other failures). Nothing there: nothing done.
void remove_tree(const fs::path& path);

// Makes sure new files can be created in `dir` now: creates it (and its parents) when missing,
// then creates and removes a probe file. bad_input Error naming the option, `dir` and the reason.
void check_writable_directory(const fs::path& dir, std::string_view option);

// The name of this host, as staging directory names record it ("" when unknown).
[[nodiscard]] std::string host_name();

// A directory that becomes `target` once complete: "<target>.partial-<host>-<pid>-<n>" next to
// it, created exclusively (never one that exists, never through a link). The target's parent is
// created when missing; bad_input naming it when it cannot be created or written. Destroyed
// before install(), the staging directory is removed with all it holds.
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
  // `replace` and only when it is ours (checked again now): it is renamed aside
  // ("<target>.old-<host>-<pid>-<n>"), the staging directory renamed in, the parent fsynced, and
  // the old one removed.
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
// process is gone. Others (another host's, a live process's, links) are left alone. Returns the
// names removed.
std::vector<std::string> remove_abandoned_staging(const fs::path& target);

// The directory an exporter writes (`option`, e.g. "--output", names it), checked before any
// work: output_directory's checks; when it exists, a usage Error without `overwrite`, and
// require_ours with it; then this host's abandoned staging directories of it removed.
[[nodiscard]] fs::path replaceable_output(std::string_view option, const std::string& value,
                                          OwnedKind kind, bool overwrite);

}  // namespace l3::core
