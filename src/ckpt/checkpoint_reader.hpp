// Reading checkpoints back: verification (manifest, files, sizes, the tensor table against the
// model, and every slice's xxHash64), the choice of the checkpoint to resume from (newest good
// one; broken ones are renamed aside with the reason, never deleted), and each rank's share of
// the state for any number of ranks.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"
#include "ckpt/rank_state.hpp"
#include "model/parameter_layout.hpp"

namespace l3::ckpt {

struct Verification {
  bool ok = false;
  std::string problem;  // why not ok, one line
  Manifest manifest;    // valid when the manifest could be read
  // With checksums: {"model.h5": {tensor: xxh64 of the whole tensor}, "optim.h5": {...}},
  // independent of how the writing ranks sliced the tensors (compare runs of any size).
  nlohmann::json digests = nlohmann::json::object();
  std::int64_t bytes = 0;  // data bytes checked
};

// checksums = false: the manifest, the files, their sizes, the HDF5 structure and the tensor
// table only (fast); true: every byte of every slice as well.
[[nodiscard]] Verification verify_checkpoint(const std::string& step_dir, bool checksums);

struct ResumePick {
  std::string step_dir;               // empty: nothing to resume from
  std::vector<std::string> rejected;  // "step-N: why", newest first
};

// Rank 0. Verifies the complete checkpoints under `root` newest first and returns the first
// good one. A broken one is renamed to step-N.damaged (with why-damaged.txt inside) so that it
// is neither retried nor overwritten silently, and `latest` is pointed at the pick.
[[nodiscard]] ResumePick pick_resume_checkpoint(const std::string& root, bool checksums);

// Checks the weights read from STEP_DIR/model.h5 into `flat` (laid out by `layout`) against
// the manifest's per-slice checksums, so that --init never starts from damaged weights without
// reading the file twice. Tensors the layout lacks or `skip` names are not checked (a reward
// model taking an SFT model's backbone). A checkpoint without a tensor table has nothing to
// check against. bad_input Errors name the file and tensor.
void check_loaded_model(const Manifest& manifest, const std::string& step_dir,
                        const model::ParameterLayout& layout, std::span<const float> flat,
                        const std::function<bool(const std::string&)>& skip);

// The same for one tensor read whole (`values`: its numel elements), when the manifest lists it.
void check_loaded_tensor(const Manifest& manifest, const std::string& step_dir,
                         const model::TensorInfo& tensor, std::span<const float> values);

// The same checks without holding the weights, shared among `parts` ranks: part p reads and
// checks the manifest's slices p, p + parts, p + 2 parts, ... one at a time, so that ranks that
// each read only their share of the weights (parameter sharding) still check every byte once,
// holding at most one slice (at most one tensor).
void check_model_share(const Manifest& manifest, const std::string& step_dir,
                       const model::ParameterLayout& layout,
                       const std::function<bool(const std::string&)>& skip, int part, int parts);

// This rank's ranges of the master weights and AdamW moments. bad_input Errors name the file
// and tensor.
[[nodiscard]] RankState read_rank_state(const std::string& step_dir,
                                        const model::ParameterLayout& layout,
                                        std::vector<model::FlatRange> ranges);

}  // namespace l3::ckpt
