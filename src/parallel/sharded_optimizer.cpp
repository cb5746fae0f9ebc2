#include "parallel/sharded_optimizer.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace l3::parallel {

ShardedOptimizer::ShardedOptimizer(kernels::Ops& ops, const model::ParameterLayout& layout,
                                   train::AdamWConfig adamw, const ShardPlan& plan, int rank,
                                   OptimizerSharding sharding, ModelWeights weights)
    : ops_(ops), layout_(layout), plan_(plan), rank_(rank), sharding_(sharding), weights_(weights) {
  if (sharding_.shard_master != weights_.master.empty() ||
      (sharding_.gathered && (!sharding_.shard_master || !weights_.compute.empty())) ||
      (ops.compute_dtype() != kernels::DType::f32 && weights_.compute.empty() &&
       !sharding_.gathered)) {
    throw core::internal_error("ShardedOptimizer: master weights and compute weights disagree");
  }
  if (!sharding_.sharded) {
    optimizers_.emplace_back(ops, layout, adamw,
                             train::AdamWShard{.own_master = sharding_.shard_master});
    return;
  }
  // One per bucket, empty pieces included: the bucket's index is its optimizer's.
  optimizers_.reserve(plan.buckets().size());
  for (std::size_t b = 0; b < plan.buckets().size(); ++b) {
    const model::FlatRange p = plan.piece(b, rank);
    optimizers_.emplace_back(ops, layout, adamw,
                             train::AdamWShard{.begin = p.begin,
                                               .end = p.end,
                                               .own_master = sharding_.shard_master,
                                               .own_gradients = sharding_.own_gradients,
                                               .gradient_dtype = sharding_.gradient_dtype});
  }
}

void ShardedOptimizer::update(kernels::TensorView grads, float lr, float grad_scale) {
  for (train::AdamW& optimizer : optimizers_)
    optimizer.step(weights_.master, weights_.compute, grads, lr, grad_scale);
}

std::vector<model::FlatRange> ShardedOptimizer::state_ranges() const {
  if (!sharding_.sharded) return {{0, layout_.total()}};
  return plan_.owned(rank_);
}

kernels::TensorView ShardedOptimizer::master_of(model::FlatRange r) {
  if (!sharding_.shard_master) return weights_.master.slice(r.begin, r.size());
  const auto [optimizer, offset] = optimizer_at(r.begin);
  return optimizer->own_master().slice(offset, r.size());
}

void ShardedOptimizer::save_master(const std::vector<model::FlatRange>& ranges,
                                   std::span<float> values) {
  std::size_t at = 0;
  for (const model::FlatRange& r : ranges) {
    const auto n = static_cast<std::size_t>(r.size());
    ops_.copy(kernels::TensorView(values.subspan(at, n)), master_of(r));
    at += n;
  }
  ops_.synchronize();
}

void ShardedOptimizer::load_master(const std::vector<model::FlatRange>& ranges,
                                   std::span<const float> values) {
  std::size_t at = 0;
  for (const model::FlatRange& r : ranges) {
    const auto n = static_cast<std::size_t>(r.size());
    const kernels::TensorView master = master_of(r);
    ops_.copy(master, kernels::ConstTensorView(values.subspan(at, n)));
    if (!weights_.compute.empty()) ops_.copy(weights_.compute.slice(r.begin, r.size()), master);
    at += n;
  }
  ops_.synchronize();
}

void ShardedOptimizer::load_master_from_whole(std::span<const float> all) {
  if (static_cast<std::int64_t>(all.size()) != layout_.total()) {
    throw core::internal_error("load_master_from_whole: not the whole layout");
  }
  for (const model::FlatRange& r : state_ranges()) {
    load_master({r},
                all.subspan(static_cast<std::size_t>(r.begin), static_cast<std::size_t>(r.size())));
  }
}

std::pair<train::AdamW*, std::int64_t> ShardedOptimizer::optimizer_at(std::int64_t begin) {
  for (train::AdamW& o : optimizers_) {
    if (begin >= o.begin() && begin < o.end()) return {&o, begin - o.begin()};
  }
  throw core::internal_error(fmt::format("no optimizer of this rank holds position {}", begin));
}

void ShardedOptimizer::save_moments(const std::vector<model::FlatRange>& ranges, std::span<float> m,
                                    std::span<float> v) {
  std::size_t at = 0;
  for (const model::FlatRange& r : ranges) {
    const auto [optimizer, offset] = optimizer_at(r.begin);
    const auto n = static_cast<std::size_t>(r.size());
    ops_.copy(kernels::TensorView(m.subspan(at, n)),
              optimizer->first_moment().slice(offset, r.size()));
    ops_.copy(kernels::TensorView(v.subspan(at, n)),
              optimizer->second_moment().slice(offset, r.size()));
    at += n;
  }
  ops_.synchronize();
}

void ShardedOptimizer::load_moments(const std::vector<model::FlatRange>& ranges,
                                    std::span<const float> m, std::span<const float> v) {
  std::size_t at = 0;
  for (const model::FlatRange& r : ranges) {
    const auto [optimizer, offset] = optimizer_at(r.begin);
    const auto n = static_cast<std::size_t>(r.size());
    ops_.copy(optimizer->first_moment().slice(offset, r.size()),
              kernels::ConstTensorView(m.subspan(at, n)));
    ops_.copy(optimizer->second_moment().slice(offset, r.size()),
              kernels::ConstTensorView(v.subspan(at, n)));
    at += n;
  }
  ops_.synchronize();
}

std::int64_t ShardedOptimizer::adamw_steps() const noexcept {
  return optimizers_.empty() ? 0 : optimizers_.front().steps_taken();
}

void ShardedOptimizer::set_adamw_steps(std::int64_t steps) noexcept {
  for (train::AdamW& o : optimizers_) o.set_steps_taken(steps);
}

}  // namespace l3::parallel
