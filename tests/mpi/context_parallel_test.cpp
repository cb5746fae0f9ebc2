// Context parallelism (--context-parallel C) in the model: every rank of the world holds a share
// of the same whole batch (data::context_share, chunks r and 2C - 1 - r of every row) and its
// attention reads the whole sequence's keys and values from the group (parallel::ContextGroup).
// The shares' losses add up to the whole batch's on one rank, and their gradients, summed over
// the ranks as data parallelism sums them, to the whole batch's gradients (fp32 tolerance:
// the sums run in another order), with packed documents crossing the chunks, recomputation
// and LoRA adapters.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "catch.hpp"
#include "dist/collectives.hpp"
#include "dist/world.hpp"
#include "io/data/context_share.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/batch.hpp"
#include "model/llama_model.hpp"
#include "model/memory_plan.hpp"
#include "parallel/context_group.hpp"
#include "relative_rms.hpp"
#include "train/objectives/language_model_loss.hpp"

using l3::model::Batch;
using l3::model::LlamaModel;

namespace {

l3::model::ModelConfig test_model() {
  l3::model::ModelConfig c = l3::model::preset("tiny");
  c.n_layers = 2;
  return c;
}

// Two rows of 48 x C tokens holding documents of many lengths, some crossing chunks and longer
// than a chunk, and padding: the same on every rank (a fixed seed).
Batch whole_batch(int ranks, std::int64_t vocab) {
  std::mt19937 rnd(2024);
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab) - 1);
  const std::int64_t row = std::int64_t{48} * ranks;
  l3::model::BatchBuilder builder(2, row, 0);
  for (const std::int64_t length :
       {std::int64_t{5}, row / 2 + 3, std::int64_t{17}, std::int64_t{2}, row - 1}) {
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(length));
    for (std::int32_t& t : tokens) t = token(rnd);
    std::vector<std::uint8_t> mask(tokens.size(), 1);
    mask[0] = 0;
    REQUIRE(builder.add(tokens, mask) >= 0);  // the last one starts the second row
  }
  return builder.finish();
}

struct Pass {
  double loss = 0;
  std::vector<double> gradients;
};

Pass run(LlamaModel& model, const Batch& batch) {
  l3::train::LanguageModelLoss objective(model);
  model.zero_gradients();
  const l3::kernels::LossSum sum = objective.forward_backward(batch, 1.0F);
  const std::span<const float> g = model.gradients().as<float>();
  return {sum.loss, std::vector<double>(g.begin(), g.end())};
}

}  // namespace

TEST_CASE("context-parallel shares add up to the whole batch's loss and gradients", "[context]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const int ranks = world.size();
  l3::kernels::CpuOps ops;
  const l3::model::ModelConfig config = test_model();
  const Batch whole = whole_batch(ranks, config.vocab_size);
  const Batch share = l3::data::context_share(whole, world.rank(), ranks);
  REQUIRE(share.tokens_count() * ranks == whole.tokens_count());
  l3::parallel::ContextGroup group(world, ranks);

  for (const bool recompute : {false, true}) {
    for (const int lora_rank : {0, 4}) {
      INFO("recompute " << recompute << ", LoRA rank " << lora_rank);
      l3::model::ModelOptions options{.recompute = recompute};
      options.lora.rank = lora_rank;
      LlamaModel model(config, l3::model::HeadKind::language_model, ops, options);
      model.initialize(11);
      if (lora_rank > 0) {
        // Non-zero B (PEFT starts it at zero), so that A's gradients are not all zero.
        const std::span<float> adapters = model.trainable_parameters().as<float>();
        std::mt19937 rnd(5);
        std::normal_distribution<float> normal(0.0F, 0.02F);
        for (float& a : adapters) a = normal(rnd);
      }
      const Pass expected = run(model, whole);  // the whole batch on this rank alone

      model.set_context_exchange(&group);
      Pass mine = run(model, share);
      std::vector<double> sums = {mine.loss};
      l3::dist::all_reduce(world.comm(), std::span<double>(sums), l3::dist::ReduceOp::sum);
      l3::dist::all_reduce(world.comm(), std::span<double>(mine.gradients),
                           l3::dist::ReduceOp::sum);
      model.set_context_exchange(nullptr);
      CHECK(std::abs(sums[0] - expected.loss) <= 1e-6 * std::abs(expected.loss));
      CHECK(l3::test::relative_rms(mine.gradients, expected.gradients) < 1e-5);
      double largest = 0;
      for (std::size_t i = 0; i < expected.gradients.size(); ++i) {
        largest = std::max(largest, std::abs(mine.gradients[i] - expected.gradients[i]));
      }
      INFO("largest difference " << largest);
      CHECK(largest < 1e-5);
    }
  }
}

TEST_CASE("a share without its group is refused", "[context]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  l3::kernels::CpuOps ops;
  const l3::model::ModelConfig config = test_model();
  const Batch share = l3::data::context_share(whole_batch(2, config.vocab_size), 0, 2);
  LlamaModel model(config, l3::model::HeadKind::language_model, ops, {});
  model.initialize(11);
  l3::train::LanguageModelLoss objective(model);
  CHECK_THROWS(objective.forward_backward(share, 1.0F));
}

TEST_CASE("the memory plan is what a share allocates", "[context][memory]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const int ranks = world.size();
  l3::kernels::CpuOps ops;
  const l3::model::ModelConfig config = test_model();
  const Batch whole = whole_batch(ranks, config.vocab_size);
  const Batch share = l3::data::context_share(whole, world.rank(), ranks);
  l3::parallel::ContextGroup group(world, ranks);
  LlamaModel model(config, l3::model::HeadKind::language_model, ops, {});
  model.initialize(11);
  model.set_context_exchange(&group);
  (void)run(model, share);
  CHECK(ops.allocated_bytes() ==
        l3::model::model_bytes(config, l3::model::HeadKind::language_model, l3::kernels::DType::f32,
                               false, share.tokens_count(), whole.seq_len, true, {}, ranks));
}
