#include "parallel/tensor_group.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "core/trace_range.hpp"
#include "dist/collectives.hpp"

namespace l3::parallel {

TensorGroup::TensorGroup(const dist::World& world, int ranks)
    : comm_(dist::split(world.comm(), world.rank() / std::max(ranks, 1), world.rank(),
                        "tensor group")),
      rank_(world.rank() % std::max(ranks, 1)),
      ranks_(ranks) {
  if (ranks < 1 || world.size() % ranks != 0) {
    throw core::internal_error(
        fmt::format("tensor groups of {} ranks over {}", ranks, world.size()));
  }
}

void TensorGroup::all_reduce_sum(kernels::TensorView x) {
  const core::TraceRange range("tensor all-reduce");
  if (x.numel() > 0 && x.dtype() != kernels::DType::f32) {
    throw core::internal_error("tensor all-reduce: fp32 host memory only (the CPU backend)");
  }
  const std::span<float> values = x.numel() > 0 ? x.as<float>() : std::span<float>{};
  const std::size_t count = values.size();
  staging_.resize(count * static_cast<std::size_t>(ranks_));
  dist::all_gather(comm_.get(), std::span<const float>(values), std::span<float>(staging_),
                   "tensor parallelism: the residual stream's parts");
  std::copy_n(staging_.begin(), count, values.begin());
  for (int r = 1; r < ranks_; ++r) {
    const float* part = staging_.data() + static_cast<std::size_t>(r) * count;
#pragma omp simd
    for (std::size_t i = 0; i < count; ++i) values[i] += part[i];
  }
}

void TensorGroup::all_gather(std::span<const double> mine, std::span<double> all) {
  if (all.size() != mine.size() * static_cast<std::size_t>(ranks_)) {
    throw core::internal_error(fmt::format("tensor all-gather: {} values of {} ranks into {}",
                                           mine.size(), ranks_, all.size()));
  }
  dist::all_gather(comm_.get(), mine, all, "tensor parallelism: the softmax's statistics");
}

}  // namespace l3::parallel
