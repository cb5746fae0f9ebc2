#include "parallel/placement_choice.hpp"

#include <fmt/format.h>

#include <string>

#include "core/error.hpp"
#include "train/train_config.hpp"

namespace l3::parallel {

namespace {

void require(bool ok, std::string_view message) {
  if (!ok) throw core::usage_error(std::string(message));
}

}  // namespace

void check_sharding_options(const train::TrainConfig& c) {
  require(c.shard_optimizer || !c.shard_gradients,
          "--shard-gradients (ZeRO-2) needs the sharded optimizer: drop --no-shard-optimizer");
  require(c.shard_gradients || !c.shard_parameters,
          "--shard-parameters (ZeRO-3) needs --shard-gradients (ZeRO-2) and the sharded optimizer");
  require(c.shard_group_size == 0 || c.shard_parameters,
          "--shard-group-size needs --shard-parameters (ZeRO-3)");
  require(!c.lora.enabled() || c.shard_group_size == 0,
          "--lora-rank with --shard-group-size: LoRA shards its frozen model over all ranks "
          "(drop --shard-group-size)");
}

model::Placement choose_placement(const train::TrainConfig& c, int ranks, kernels::DType compute) {
  check_sharding_options(c);
  const int cp = c.context_parallel;
  if (cp < 1 || ranks % cp != 0) {
    throw core::usage_error(fmt::format(
        "--context-parallel {}: the {} ranks must split into groups of {} (a divisor of {})", cp,
        ranks, cp, ranks));
  }
  if (cp > 1) {
    require(c.phase != Phase::grpo,
            "--context-parallel: not with grpo so far (its completions are generated and scored "
            "per rank)");
    if (c.seq_len % (2 * cp) != 0) {
      throw core::usage_error(fmt::format(
          "--context-parallel {}: --seq-len {} must be a multiple of {} (each row is cut into "
          "2 x {} chunks)",
          cp, c.seq_len, 2 * cp, cp));
    }
  }
  const int tp = c.tensor_parallel;
  if (tp < 1 || ranks % (cp * tp) != 0) {
    throw core::usage_error(fmt::format(
        "--tensor-parallel {}{}: the {} ranks must split into groups of {} (a divisor of {})", tp,
        cp > 1 ? fmt::format(" with --context-parallel {}", cp) : std::string(), ranks, cp * tp,
        ranks));
  }
  if (tp > 1) {
    require(!c.lora.enabled(),
            "--tensor-parallel: not with --lora-rank so far (the adapters are not split yet)");
    require(c.phase != Phase::grpo,
            "--tensor-parallel: not with grpo so far (the generation engine does not split "
            "layers yet)");
    require(c.ckpt_local.empty(),
            "--tensor-parallel: not with --ckpt-local so far (the node-local level keeps each "
            "rank's state in its own layout); --ckpt-dir's checkpoints work");
  }
  // The states are sharded over the ranks of one tensor rank.
  const int state_ranks = ranks / tp;
  const int g = c.shard_group_size;
  if (g > 0 && (g > state_ranks || state_ranks % g != 0 || (g < 2 && state_ranks > 1))) {
    throw core::usage_error(fmt::format(
        "--shard-group-size {}: the {} ranks{} must split into groups of at least 2 ranks (a "
        "divisor of {})",
        g, state_ranks, tp > 1 ? fmt::format(" of each tensor rank (of {})", ranks) : "",
        state_ranks));
  }
  using model::ZeroStage;
  const ZeroStage stage = c.shard_parameters  ? ZeroStage::parameters
                          : c.shard_gradients ? ZeroStage::gradients
                          : c.shard_optimizer ? ZeroStage::optimizer
                                              : ZeroStage::replicated;
  return {
      .stage = stage,
      .ranks = ranks,
      .shard_group = g,
      .frozen_model = c.lora.enabled(),
      // In bf16 the fp32 master weights live in the optimizer (this rank's ZeRO-1 pieces only);
      // at stage parameters those pieces are the only copy of the weights.
      .master_in_optimizer =
          compute != kernels::DType::f32 || c.master_in_optimizer || c.shard_parameters,
      .fp32_gradients = c.fp32_gradients(ranks),
      .context_parallel = cp,
      .tensor_parallel = tp,
  };
}

}  // namespace l3::parallel
