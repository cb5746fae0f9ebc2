// Which run a checkpoint belongs to, as one key: what makes a run's state its own and no other
// run's. The node-local level (docs/HPC.md) uses it: a node's storage outlives a job, and a later
// job into the same --ckpt-dir with another --init, --seed, --model or --data must not pick up
// the earlier run's states; such files are left unused (with a warning) and the run falls back
// to --ckpt-dir, the same on every rank.
#pragma once

#include <string>

#include "dist/world.hpp"
#include "train/train_config.hpp"

namespace l3::train {

// The identity of an --init model as it is now: a checkpoint's step directory (its root's
// latest) with the xxHash64 of its manifest (which holds every slice's checksum), or a Hugging
// Face directory with the names, sizes and modification times of its files; "" for none.
// Replacing the files (even by a copy) makes another identity. bad_input Errors as resolving
// the model does.
[[nodiscard]] std::string model_identity(const std::string& init);

// The run's key (16 hex digits): the phase, --model, --init's identity, --seed, --data, LoRA's
// rank and targets and --init-adapter. Options that only change how training proceeds (the
// learning rate, the batch) are not in it: resuming with those changed is refused or allowed
// (--allow-config-change) by the resume checks, as for --ckpt-dir. Collective: rank 0 computes
// it, every rank gets it.
[[nodiscard]] std::string run_key(const dist::World& world, const TrainConfig& config);

// A new run's own identity (16 hex digits from the clock, the host, the process and the system's
// random source): unlike run_key, two runs with the same options get different ones. Recorded
// in every checkpoint and carried over by resumes. Collective: rank 0 draws it, every rank
// gets it.
[[nodiscard]] std::string new_run_id(const dist::World& world);

}  // namespace l3::train
