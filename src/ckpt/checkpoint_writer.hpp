// Writing a checkpoint step directory: the files go into <root>/step-N.partial/, are fsynced,
// the manifest is written last, the directory is renamed to step-N and `latest` is replaced
// atomically (write temp + fsync + rename). A crash at any point leaves the previous
// checkpoint and `latest` intact.
//
// This is the synchronous, rank-0-writes form: the model is replicated on every rank after a
// step, so rank 0 alone holds everything model.h5 needs. (Parallel, sharded and asynchronous
// writes of the optimizer state come with the restart protocol; the on-disk layout stays.)
#pragma once

#include <span>
#include <string>

#include "ckpt/manifest.hpp"
#include "dist/world.hpp"
#include "model/parameter_layout.hpp"

namespace l3::ckpt {

// Collective over `world`. `master` (layout.total() fp32 values) is read on rank 0 only.
// Returns the committed step directory. A failure on rank 0 is thrown on every rank (the
// others as core::PeerFailure).
std::string commit_checkpoint(const dist::World& world, const std::string& root,
                              const Manifest& manifest, const model::ParameterLayout& layout,
                              std::span<const float> master);

}  // namespace l3::ckpt
