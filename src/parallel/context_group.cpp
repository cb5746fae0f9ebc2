#include "parallel/context_group.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "core/trace_range.hpp"
#include "dist/collectives.hpp"

namespace l3::parallel {

ContextGroup::ContextGroup(const dist::World& world, int ranks)
    : comm_(dist::split(world.comm(), world.rank() / ranks, world.rank(), "context group")),
      rank_(world.rank() % ranks),
      ranks_(ranks) {
  if (ranks < 1 || world.size() % ranks != 0) {
    throw core::internal_error(
        fmt::format("context groups of {} ranks over {}", ranks, world.size()));
  }
}

ContextGroup::Layout ContextGroup::layout(kernels::ConstTensorView local,
                                          kernels::ConstTensorView whole, std::int64_t rows,
                                          const char* what) const {
  if (local.dtype() != kernels::DType::f32 || whole.dtype() != kernels::DType::f32) {
    throw core::internal_error(
        fmt::format("context {}: fp32 host memory only (the CPU backend)", what));
  }
  const std::int64_t n = local.rank() > 0 ? local.dim(0) : 0;
  if (rows <= 0 || n % (2 * rows) != 0 || whole.numel() != local.numel() * ranks_ ||
      (n > 0 && whole.dim(0) != n * ranks_)) {
    throw core::internal_error(
        fmt::format("context {}: a share of {} tokens in {} rows and a "
                    "whole of {} values over {} ranks",
                    what, n, rows, whole.numel(), ranks_));
  }
  return {.chunk = n / (2 * rows), .width = n > 0 ? local.numel() / n : 0, .local = local.numel()};
}

std::int64_t ContextGroup::whole_offset(const Layout& l, int r, std::int64_t b, int p) const {
  const std::int64_t chunk = p == 0 ? r : 2 * ranks_ - 1 - r;
  return (b * 2 * ranks_ + chunk) * l.chunk * l.width;
}

void ContextGroup::all_gather(kernels::ConstTensorView local, kernels::TensorView whole,
                              std::int64_t rows) {
  const core::TraceRange range("context all-gather");
  const Layout l = layout(local, whole, rows, "all-gather");
  staging_.resize(static_cast<std::size_t>(l.local * ranks_));
  dist::all_gather(comm_.get(), local.as<float>(), std::span<float>(staging_),
                   "context parallelism: keys and values");
  const std::span<float> out = whole.as<float>();
  const std::int64_t part = l.chunk * l.width;
  for (int r = 0; r < ranks_; ++r) {
    for (std::int64_t b = 0; b < rows; ++b) {
      for (int p = 0; p < 2; ++p) {
        const auto from = staging_.begin() + r * l.local + (2 * b + p) * part;
        std::copy(from, from + part, out.begin() + whole_offset(l, r, b, p));
      }
    }
  }
}

void ContextGroup::reduce_scatter(kernels::ConstTensorView whole, kernels::TensorView local,
                                  std::int64_t rows) {
  const core::TraceRange range("context reduce-scatter");
  const Layout l = layout(local, whole, rows, "reduce-scatter");
  staging_.resize(static_cast<std::size_t>(l.local * ranks_));
  const std::span<const float> in = whole.as<float>();
  const std::int64_t part = l.chunk * l.width;
  for (int r = 0; r < ranks_; ++r) {
    for (std::int64_t b = 0; b < rows; ++b) {
      for (int p = 0; p < 2; ++p) {
        const auto from = in.begin() + whole_offset(l, r, b, p);
        std::copy(from, from + part, staging_.begin() + r * l.local + (2 * b + p) * part);
      }
    }
  }
  dist::reduce_scatter_block(comm_.get(), std::span<const float>(staging_), local.as<float>(),
                             dist::ReduceOp::sum, "context parallelism: key and value gradients");
}

template <typename T>
std::vector<T> ContextGroup::gather_varying(std::span<const T> mine) const {
  const int count = static_cast<int>(mine.size());
  const std::vector<int> counts =
      dist::all_gather(comm_.get(), count, "context parallelism: row counts");
  std::vector<int> displacements(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r)
    displacements[r] = displacements[r - 1] + counts[r - 1];
  std::vector<T> all(static_cast<std::size_t>(displacements.back() + counts.back()));
  std::copy(mine.begin(), mine.end(), all.begin() + displacements[static_cast<std::size_t>(rank_)]);
  dist::all_gatherv(comm_.get(), std::span<T>(all), std::span<const int>(counts),
                    std::span<const int>(displacements), "context parallelism: rows' values");
  return all;
}

std::vector<float> ContextGroup::all_gather_varying(std::span<const float> mine) {
  return gather_varying(mine);
}

std::vector<std::int32_t> ContextGroup::all_gather_varying(std::span<const std::int32_t> mine) {
  return gather_varying(mine);
}

}  // namespace l3::parallel
