// l3::DataSource as a train::StepSource: the host's documents or preference pairs for a step,
// packed into this rank's micro-batches the way the shard loader packs them (model::BatchBuilder:
// whole documents in order, rows of --seq-len, no attention across documents).
#pragma once

#include <memory>

#include "l3/l3.hpp"
#include "train/step_source.hpp"

namespace l3::api {

[[nodiscard]] std::unique_ptr<train::StepSource> host_step_source(
    std::shared_ptr<DataSource> source);

}  // namespace l3::api
