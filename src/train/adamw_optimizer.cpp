#include "train/adamw_optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace l3::train {

namespace {

AdamWShard resolved(AdamWShard shard, const model::ParameterLayout& layout) {
  if (shard.end < 0) shard.end = layout.total();
  if (shard.begin < 0 || shard.end < shard.begin || shard.end > layout.total()) {
    throw core::internal_error("AdamW: range outside the parameter buffer");
  }
  return shard;
}

}  // namespace

AdamW::AdamW(kernels::Ops& ops, const model::ParameterLayout& layout, AdamWConfig config,
             AdamWShard requested)
    : ops_(ops), layout_(layout), config_(config) {
  const AdamWShard shard = resolved(requested, layout);
  begin_ = shard.begin;
  end_ = shard.end;
  const std::int64_t n = end_ - begin_;
  m_ = ops.allocate(kernels::DType::f32, n);
  v_ = ops.allocate(kernels::DType::f32, n);
  if (shard.own_master) master_ = ops.allocate(kernels::DType::f32, n);
  if (shard.own_gradients) grads_ = ops.allocate(shard.gradient_dtype, n);
}

void AdamW::step(kernels::TensorView master, kernels::TensorView weight_copy,
                 kernels::ConstTensorView grads, float lr, float grad_scale) {
  ++step_;
  kernels::AdamWParams hyper{lr,   config_.beta1, config_.beta2, config_.eps,
                             0.0F, grad_scale,    step_};
  for (const model::TensorInfo& t : layout_.tensors()) {
    const std::int64_t lo = std::max(begin_, t.offset);
    const std::int64_t hi = std::min(end_, t.offset + t.numel);
    if (lo >= hi) continue;
    hyper.weight_decay = t.decay ? config_.weight_decay : 0.0F;
    ops_.adamw({.params = master_.numel() > 0 ? master_.slice(lo - begin_, hi - lo)
                                              : master.slice(lo, hi - lo),
                .params_copy =
                    weight_copy.empty() ? kernels::TensorView{} : weight_copy.slice(lo, hi - lo),
                .m = m_.slice(lo - begin_, hi - lo),
                .v = v_.slice(lo - begin_, hi - lo),
                .grads = grads_.numel() > 0 ? grads_.slice(lo - begin_, hi - lo)
                                            : grads.slice(lo, hi - lo),
                .hyper = hyper});
  }
}

double gradient_norm(kernels::Ops& ops, kernels::ConstTensorView grads) {
  return std::sqrt(ops.sum_squares(grads));
}

double clip_factor(double norm, double max_norm) {
  if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

}  // namespace l3::train
