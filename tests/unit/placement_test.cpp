// The placement (model/placement.hpp) chosen from the sharding options once
// (parallel/placement_choice.cpp): the stage, hybrid groups, LoRA's frozen model, where the master
// weights live, the buffers a model owns under it, and the options' rules.
#include "model/placement.hpp"

#include <string>

#include "catch.hpp"
#include "core/error.hpp"
#include "core/phase.hpp"
#include "model/llama_model.hpp"
#include "parallel/placement_choice.hpp"
#include "train/train_config.hpp"

using l3::kernels::DType;
using l3::model::Placement;
using l3::model::ZeroStage;
using l3::parallel::choose_placement;
using l3::train::TrainConfig;

namespace {

std::string usage_error_of(const TrainConfig& c, int ranks) {
  try {
    (void)choose_placement(c, ranks, DType::bf16);
  } catch (const l3::core::Error& e) {
    CHECK(e.exit_code() == l3::core::kExitBadInput);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the sharding options make one stage", "[placement]") {
  TrainConfig c;
  CHECK(choose_placement(c, 4, DType::bf16).stage == ZeroStage::optimizer);
  c.shard_optimizer = false;
  CHECK(choose_placement(c, 4, DType::bf16).stage == ZeroStage::replicated);
  CHECK(choose_placement(c, 4, DType::bf16).stage_name() == "0 (off)");
  c.shard_optimizer = true;
  c.shard_gradients = true;
  const Placement zero2 = choose_placement(c, 4, DType::f32);
  CHECK(zero2.stage == ZeroStage::gradients);
  CHECK(zero2.shards_gradients());
  CHECK_FALSE(zero2.shards_trained_weights());
  CHECK_FALSE(zero2.master_in_optimizer);  // f32: the model keeps its master weights
  CHECK(choose_placement(c, 4, DType::bf16).master_in_optimizer);
  c.shard_parameters = true;
  const Placement zero3 = choose_placement(c, 4, DType::f32);
  CHECK(zero3.shards_trained_weights());
  CHECK(zero3.master_in_optimizer);  // the optimizers' pieces are the only copy
  CHECK_FALSE(zero3.model_holds_weights());
  CHECK(zero3.stage_name() == "3");
  c.shard_group_size = 2;
  const Placement hybrid = choose_placement(c, 4, DType::bf16);
  CHECK(hybrid.hybrid());
  CHECK(hybrid.shard_ranks() == 2);
  CHECK(hybrid.stage_name() == "3 (hybrid: shard groups of 2 ranks)");
  // A group of all the ranks is no hybrid.
  CHECK_FALSE(choose_placement(c, 2, DType::bf16).hybrid());
  CHECK(choose_placement(c, 2, DType::bf16).shard_ranks() == 2);
}

TEST_CASE("LoRA over a sharded frozen model", "[placement]") {
  TrainConfig c;
  c.lora.rank = 4;
  c.shard_gradients = true;
  c.shard_parameters = true;
  const Placement p = choose_placement(c, 3, DType::bf16);
  CHECK(p.shards_frozen_weights());
  CHECK_FALSE(p.shards_trained_weights());  // the adapters are held whole
  CHECK(p.shards_gradients());              // and get ZeRO-2
  CHECK(p.stage_name() == "2 over the adapters, the frozen model sharded (1/3 on each rank)");
  const l3::model::ModelOptions o = l3::model::ModelOptions::of(p, true, c.lora);
  CHECK(o.recompute);
  CHECK_FALSE(o.own_parameters);
  CHECK_FALSE(o.own_gradients);
  CHECK_FALSE(o.keep_master);
  CHECK(o.lora.rank == 4);
}

TEST_CASE("the buffers a model owns follow its placement", "[placement]") {
  using l3::model::ModelOptions;
  const ModelOptions whole = ModelOptions::of({.stage = ZeroStage::optimizer, .ranks = 2});
  CHECK(whole.keep_master);
  CHECK(whole.own_gradients);
  CHECK(whole.own_parameters);
  const ModelOptions fp32 =
      ModelOptions::of({.stage = ZeroStage::optimizer, .ranks = 2, .fp32_gradients = true});
  CHECK(fp32.fp32_gradients);
  // Forward passes only: neither gradients nor a master copy; weights sharded or whole.
  for (const bool sharded : {false, true}) {
    const Placement frozen = Placement::frozen(sharded, 4);
    CHECK(frozen.forward_only);
    CHECK(frozen.shards_frozen_weights() == sharded);
    const ModelOptions o = ModelOptions::of(frozen);
    CHECK_FALSE(o.keep_master);
    CHECK_FALSE(o.own_gradients);
    CHECK(o.own_parameters == !sharded);
  }
}

TEST_CASE("the sharding options' rules are checked in one place", "[placement]") {
  TrainConfig c;
  c.shard_optimizer = false;
  c.shard_gradients = true;
  CHECK(usage_error_of(c, 2) ==
        "--shard-gradients (ZeRO-2) needs the sharded optimizer: drop --no-shard-optimizer");
  c.shard_optimizer = true;
  c.shard_gradients = false;
  c.shard_parameters = true;
  CHECK(usage_error_of(c, 2).starts_with("--shard-parameters (ZeRO-3) needs --shard-gradients"));
  c.shard_parameters = false;
  c.shard_group_size = 2;
  CHECK(usage_error_of(c, 4) == "--shard-group-size needs --shard-parameters (ZeRO-3)");
  c.shard_gradients = true;
  c.shard_parameters = true;
  CHECK(usage_error_of(c, 4).empty());
  CHECK(usage_error_of(c, 6).empty());
  c.shard_group_size = 3;
  CHECK(usage_error_of(c, 4).starts_with("--shard-group-size 3: the 4 ranks must split"));
  c.shard_group_size = 1;
  CHECK(usage_error_of(c, 2).starts_with("--shard-group-size 1: the 2 ranks must split"));
  CHECK(usage_error_of(c, 1).empty());  // one rank: a group of one
  c.lora.rank = 4;
  c.shard_group_size = 2;
  CHECK(usage_error_of(c, 4).starts_with("--lora-rank with --shard-group-size"));
  // The rank-independent rules are the same when the options are parsed.
  try {
    l3::parallel::check_sharding_options(c);
    FAIL("no error");
  } catch (const l3::core::Error& e) {
    CHECK(std::string(e.what()).starts_with("--lora-rank with --shard-group-size"));
  }
}

TEST_CASE("the phase is spelled in one place", "[placement]") {
  for (const l3::Phase phase : {l3::Phase::sft, l3::Phase::reward, l3::Phase::dpo}) {
    CHECK(l3::core::parse_phase(l3::core::phase_name(phase)) == phase);
  }
  CHECK(l3::core::phase_name(l3::Phase::dpo) == "dpo");
  CHECK_FALSE(l3::core::parse_phase("DPO").has_value());
  CHECK_FALSE(l3::core::parse_phase("").has_value());
}
