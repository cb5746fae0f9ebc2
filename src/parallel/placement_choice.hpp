// The one place the sharding options (--no-shard-optimizer, --shard-gradients,
// --shard-parameters, --shard-group-size, LoRA, --master-in-optimizer, --grad-accum-dtype) are
// checked against each other and turned into a model::Placement that every layer reads.
#pragma once

#include "kernels/tensor.hpp"
#include "model/placement.hpp"

namespace l3::train {
struct TrainConfig;
}  // namespace l3::train

namespace l3::parallel {

// usage Errors (naming the options) for combinations that are wrong whatever the ranks:
// TrainConfig::validate calls it when the options are parsed.
void check_sharding_options(const train::TrainConfig& config);

// The placement of a run of `config` on `ranks` ranks whose backend computes in `compute`;
// checks check_sharding_options and what depends on the ranks (the shard groups divide them).
[[nodiscard]] model::Placement choose_placement(const train::TrainConfig& config, int ranks,
                                                kernels::DType compute);

}  // namespace l3::parallel
