#include "parallel/sharded_weights.hpp"

#include "ckpt/rank_state.hpp"
#include "core/error.hpp"

namespace l3::parallel {

ShardedWeights::ShardedWeights(const dist::World& world, kernels::Ops& ops,
                               const model::ParameterLayout& layout,
                               const train::ModelSource& source, std::uint64_t seed,
                               const model::AdapterFold* adapters)
    : plan_({.total = layout.total(),
             .groups = layout.gradient_groups(),
             .ranks = world.size(),
             .bucket_elements = std::int64_t{8} << 20}),
      rank_(world.rank()) {
  const std::vector<model::FlatRange> mine = plan_.owned(world.rank());
  at_.assign(plan_.buckets().size(), -1);
  for (std::size_t b = 0; b < plan_.buckets().size(); ++b) {
    const model::FlatRange p = plan_.piece(b, world.rank());
    if (p.size() == 0) continue;
    at_[b] = held_;
    held_ += p.size();
  }
  pieces_ = ops.allocate(ops.compute_dtype(), held_);
  {
    // fp32 on the host for as long as the copy takes (rounded to the compute dtype by it).
    std::vector<float> values = initial_weights_of_ranges(world, layout, source, seed, mine);
    if (adapters != nullptr) {
      for (const ckpt::TensorSlice& slice : ckpt::tensor_slices(layout, mine)) {
        adapters->apply(layout.tensors()[slice.tensor], slice.first,
                        std::span(values).subspan(static_cast<std::size_t>(slice.position),
                                                  static_cast<std::size_t>(slice.count)));
      }
    }
    ops.copy(pieces_.view(), kernels::ConstTensorView(std::span<const float>(values)));
    ops.synchronize();
  }
  gather_ = std::make_unique<ParameterGather>(
      world, ops, plan_,
      [this](std::size_t bucket) -> kernels::ConstTensorView {
        const std::int64_t at = at_[bucket];
        if (at < 0) throw core::internal_error("ShardedWeights: no piece of this bucket here");
        return pieces_.slice(at, plan_.piece(bucket, rank_).size());
      },
      ExchangeChoice::automatic, /*prefetch=*/true,
      layout.lm_head_tied() ? std::size_t{0} : ParameterGather::kNoGroup);
}

ShardedWeights::HostPieces ShardedWeights::host_pieces(kernels::Ops& ops) const {
  HostPieces out{.ranges = plan_.owned(rank_), .values = {}};
  out.values.resize(static_cast<std::size_t>(held_));
  ops.copy(kernels::TensorView(std::span<float>(out.values)), pieces_.view());
  ops.synchronize();
  return out;
}

}  // namespace l3::parallel
