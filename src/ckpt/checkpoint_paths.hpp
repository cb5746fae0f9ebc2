// Where checkpoints live (docs/FORMAT.md):
//   <root>/step-00001200/         a complete checkpoint (manifest.json written last)
//   <root>/step-00001300.partial/ one being written; never read
//   <root>/latest                 the bare name of the newest complete one, "step-00001200"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace l3::ckpt {

inline constexpr std::string_view kManifestFile = "manifest.json";
inline constexpr std::string_view kModelFile = "model.h5";
inline constexpr std::string_view kOptimFile = "optim.h5";
inline constexpr std::string_view kPartialSuffix = ".partial";  // being written
inline constexpr std::string_view kDamagedSuffix = ".damaged";  // found broken, kept aside
inline constexpr std::string_view kLatestFile = "latest";

// "step-00001200" (8 digits; more when the step needs them).
[[nodiscard]] std::string step_dir_name(std::int64_t step);
// The step of a directory name "step-NNNNNNNN", or nullopt for anything else.
[[nodiscard]] std::optional<std::int64_t> parse_step_dir_name(std::string_view name);

// The names of the step directories under `root` ("step-N", committed or not: no suffix),
// newest first; and those set aside as damaged ("step-N.damaged..."). Empty when `root` does
// not exist. A symbolic link to a directory under such a name is listed too: the callers that
// write or remove check core::is_real_directory().
[[nodiscard]] std::vector<std::string> step_directories(const std::string& root);
[[nodiscard]] std::vector<std::string> damaged_directories(const std::string& root);

// What `<root>/latest` says, trimmed ("" when it is missing). It is read with a bound (a few KiB):
// bad_input Error naming it when it is longer, a directory or unreadable.
[[nodiscard]] std::string read_latest(const std::string& root);

// A step directory (holds manifest.json), or a checkpoint root whose `latest` names one.
// bad_input Error naming the path when it is neither, or when `latest` is empty, malformed or
// points at a directory that is missing or incomplete.
[[nodiscard]] std::string resolve_checkpoint(const std::string& path);
// Whether `path` looks like a checkpoint (a step directory or a root with `latest`).
[[nodiscard]] bool is_checkpoint(const std::string& path);

}  // namespace l3::ckpt
