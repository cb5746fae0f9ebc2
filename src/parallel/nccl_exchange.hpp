// The NCCL gradient exchange (CUDA builds): reduce-scatter and all-gather on the GPU's own
// buffers, queued on a communication stream of its own. Each call first makes that stream wait
// for the compute stream (an event recorded when the call is made, so the gradients queued so
// far are complete before they travel); join() makes the compute stream wait for the
// communication stream. Nothing blocks the host, so buckets go out from the backward pass's
// gradient hook and overlap the backward of the earlier layers.
//
// Pieces of equal size use ncclReduceScatter / ncclAllGather in place; a bucket with uneven
// pieces (the first one of the layout) uses one grouped ncclReduce / ncclBroadcast per rank.
// The communicator comes from a unique id broadcast over the run's MPI communicator, created
// nonblocking so that a rank whose init fails cannot strand the others (nccl_communicator.hpp);
// one rank per GPU (NCCL refuses two ranks on one device: make_gradient_exchange then picks MPI).
#pragma once

#include <memory>

#include "parallel/gradient_exchange.hpp"

namespace l3::parallel {

// Whether no two ranks of a node share a GPU (NCCL's requirement). Collective over `world`.
[[nodiscard]] bool each_rank_has_its_own_gpu(const dist::World& world, kernels::Ops& ops);

// Collective over `world`. ops must be the CUDA backend.
[[nodiscard]] std::unique_ptr<GradientExchange> make_nccl_exchange(const dist::World& world,
                                                                   kernels::Ops& ops);

}  // namespace l3::parallel
