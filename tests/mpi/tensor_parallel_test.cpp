// Tensor parallelism (--tensor-parallel T) in the model: every rank of the world holds a slice
// of the same model (its heads, MLP columns and vocabulary rows: model/tensor_slice.hpp), runs
// the same batch, and sums the residual stream's parts with the group
// (parallel::TensorGroup). Each rank's loss is the whole model's, and its gradients are the
// slice of the whole model's gradients (fp32 tolerance: the sums run in another order), with
// tied and untied embeddings and with recomputation; the replicated weights' gradients are the
// same bits on every rank.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "catch.hpp"
#include "dist/collectives.hpp"
#include "dist/world.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/batch.hpp"
#include "model/llama_model.hpp"
#include "model/tensor_slice.hpp"
#include "parallel/tensor_group.hpp"
#include "relative_rms.hpp"
#include "train/objectives/language_model_loss.hpp"

using l3::model::Batch;
using l3::model::LlamaModel;

namespace {

// Heads, key/value heads, MLP columns and vocabulary that 2 and 4 ranks divide.
l3::model::ModelConfig test_model(bool tied) {
  l3::model::ModelConfig c = l3::model::preset("tiny");
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.head_dim = 8;
  c.tie_word_embeddings = tied;
  return c;
}

// Two rows of 96 tokens holding documents of several lengths and padding (a fixed seed).
Batch test_batch(std::int64_t vocab) {
  std::mt19937 rnd(2025);
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab) - 1);
  l3::model::BatchBuilder builder(2, 96, 0);
  for (const std::int64_t length : {7, 51, 20, 2, 90}) {
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(length));
    for (std::int32_t& t : tokens) t = token(rnd);
    std::vector<std::uint8_t> mask(tokens.size(), 1);
    mask[0] = 0;
    REQUIRE(builder.add(tokens, mask) >= 0);
  }
  return builder.finish();
}

struct Pass {
  double loss = 0;
  std::vector<float> gradients;
};

Pass run(LlamaModel& model, const Batch& batch) {
  l3::train::LanguageModelLoss objective(model);
  model.zero_gradients();
  const l3::kernels::LossSum sum = objective.forward_backward(batch, 1.0F);
  const std::span<const float> g = model.gradients().as<float>();
  return {sum.loss, std::vector<float>(g.begin(), g.end())};
}

}  // namespace

TEST_CASE("tensor-parallel slices give the whole model's loss and their gradients' slice",
          "[tensor]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const int ranks = world.size();
  const l3::model::TensorSlice slice{.rank = world.rank(), .ranks = ranks};
  l3::kernels::CpuOps ops;
  l3::parallel::TensorGroup group(world, ranks);

  for (const bool tied : {false, true}) {
    for (const bool recompute : {false, true}) {
      INFO("tied " << tied << ", recompute " << recompute);
      const l3::model::ModelConfig config = test_model(tied);
      const Batch batch = test_batch(config.vocab_size);
      LlamaModel whole(config, l3::model::HeadKind::language_model, ops, {.recompute = recompute});
      whole.initialize(11);
      const Pass expected = run(whole, batch);  // the whole model on this rank alone

      l3::model::ModelOptions options{.recompute = recompute};
      options.tensor = slice;
      LlamaModel mine(config, l3::model::HeadKind::language_model, ops, options);
      REQUIRE(mine.config().n_heads == config.n_heads / ranks);
      const std::vector<l3::model::SliceRun> runs =
          l3::model::slice_runs(whole.layout(), mine.layout(), slice);
      std::vector<float> values(static_cast<std::size_t>(mine.layout().total()), 0.0F);
      l3::model::take_slice(runs, whole.parameters().as<float>(), values);
      mine.load_parameters(values);
      mine.set_tensor_exchange(&group);
      const Pass got = run(mine, batch);

      CHECK(std::abs(got.loss - expected.loss) <= 1e-6 * std::abs(expected.loss));
      std::vector<float> expected_slice(got.gradients.size(), 0.0F);
      l3::model::take_slice(runs, expected.gradients, expected_slice);
      CHECK(l3::test::relative_rms(
                std::vector<double>(got.gradients.begin(), got.gradients.end()),
                std::vector<double>(expected_slice.begin(), expected_slice.end())) < 1e-5);
      double largest = 0;
      for (std::size_t i = 0; i < got.gradients.size(); ++i) {
        largest =
            std::max(largest, static_cast<double>(std::abs(got.gradients[i] - expected_slice[i])));
      }
      INFO("largest difference " << largest);
      CHECK(largest < 1e-5);

      // A replicated weight's gradient is the same bits on every rank of the group.
      const l3::model::TensorInfo& norm = mine.layout().find("model.norm.weight");
      const std::span<const float> own(got.gradients.data() + norm.offset,
                                       static_cast<std::size_t>(norm.numel));
      std::vector<float> every(own.size() * static_cast<std::size_t>(ranks));
      l3::dist::all_gather(world.comm(), own, std::span<float>(every));
      for (int r = 0; r < ranks; ++r) {
        CHECK(std::equal(own.begin(), own.end(), every.begin() + r * own.size()));
      }
    }
  }
}

TEST_CASE("a tensor-parallel model refuses what it cannot split", "[tensor]") {
  l3::model::ModelConfig config = l3::model::preset("tiny");  // 2 key/value heads
  CHECK_THROWS(l3::model::check_tensor_parallel(config, 4));
  CHECK_NOTHROW(l3::model::check_tensor_parallel(config, 2));
  config.vocab_size = 511;
  CHECK_THROWS(l3::model::check_tensor_parallel(config, 2));
}
