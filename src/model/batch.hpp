// The model's name for the micro-batch the data layer builds (io/data/batch.hpp).
#pragma once

#include "io/data/batch.hpp"

namespace l3::model {

using Batch = data::Batch;
using BatchBuilder = data::BatchBuilder;

}  // namespace l3::model
