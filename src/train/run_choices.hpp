// The enumerated choices of a training run (its parallel arithmetic, its progress bar), as the
// library sees them
// library sees them (train_config.cpp converts them from and to the options' names).
#pragma once

#include <cstdint>

#include "parallel/exchange_choice.hpp"

namespace l3::train {

// How the gradient reduction and the weight all-gather travel (--grad-exchange), chosen by the
// run and used by data parallelism.
using ExchangeChoice = parallel::ExchangeChoice;

// The dtype gradients add up in where the backend computes in bf16 (--grad-accum-dtype):
// `automatic` is fp32 when a step has several micro-batches per rank, else the compute dtype.
enum class GradAccumDtype : std::uint8_t { automatic, fp32, bf16 };

// Rank 0's progress bar (--progress): `automatic` draws it when stderr is a terminal; `always`
// draws it through mpiexec's pipes as well (which are no terminal); `never` does not.
enum class ProgressMode : std::uint8_t { automatic, always, never };

}  // namespace l3::train
