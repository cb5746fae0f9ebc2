// CKPT_DIR/rollouts/: the generation batches of GRPO with --num-iterations > 1, one file per
// generation step ("step-NNNNNNNN.json", the step's number, 0-based, in 8 or more digits), so
// that a run resumed inside a cycle of updates trains on the batch it was drawn from. The
// directory is the program's own: it must be a real directory (never a link, whose target
// would receive the batches and lose its files to the pruning) holding nothing but those files
// (and the temporary names core/durable_file.hpp writes them under). Anything else there is
// exit 2 naming it, and never deleted.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace l3::train::grpo {

// The step of a generation batch's file name ("step-00000012.json" -> 12), or nullopt.
[[nodiscard]] std::optional<std::int64_t> rollout_file_step(std::string_view name);
// The file name of step `step`'s generation batch.
[[nodiscard]] std::string rollout_file_name(std::int64_t step);

// bad_input Error (exit 2) naming the entry when `dir` is not a real directory, or holds
// anything but regular files with one name that rollout_file_step() recognises (and temporary
// names). Nothing there: fine.
void check_rollout_cache(const std::filesystem::path& dir);

// Removes the generation batches of steps before `keep` (after check_rollout_cache()): only
// regular files of ours, never followed.
void prune_rollout_cache(const std::filesystem::path& dir, std::int64_t keep);
// The same for the batches `kept` does not keep.
void prune_rollout_cache(const std::filesystem::path& dir,
                         const std::function<bool(std::int64_t)>& kept);

}  // namespace l3::train::grpo
