// End-to-end learning on the CPU backend: the model, the losses and AdamW together.
#include "catch.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/llama_model.hpp"
#include "numeric_support.hpp"
#include "train/adamw_optimizer.hpp"
#include "train/lr_schedule.hpp"
#include "train/objectives/bradley_terry_loss.hpp"
#include "train/objectives/language_model_loss.hpp"

using l3::model::Batch;
using l3::model::BatchBuilder;
using l3::model::HeadKind;
using l3::model::LlamaModel;

TEST_CASE("a tiny model overfits 8 fixed sequences (SFT loss < 0.05)", "[training]") {
  INFO("seed " << l3::test::test_seed());
  const l3::model::ModelConfig c = l3::model::preset("tiny");
  l3::kernels::CpuOps ops;
  LlamaModel model(c, HeadKind::language_model, ops);
  model.initialize(l3::test::test_seed());
  l3::test::Random rnd(30);
  BatchBuilder builder(8, 32, 0);
  for (int s = 0; s < 8; ++s) {
    const auto tokens = rnd.integers(32, 256);
    std::vector<std::uint8_t> mask(32, 1);
    mask[0] = 0;
    REQUIRE(builder.add(tokens, mask) >= 0);
  }
  const Batch batch = builder.finish();
  const auto count = static_cast<float>(batch.counted_tokens());

  const int steps = 300;
  l3::train::AdamW opt(ops, model.layout(), {0.9F, 0.95F, 1e-8F, 0.0F});
  const l3::train::LrSchedule lr{3e-3, 3e-4, 20, steps};
  double first = 0;
  double last = 0;
  for (int step = 0; step < steps; ++step) {
    model.zero_gradients();
    const auto loss = l3::train::LanguageModelLoss(model).forward_backward(batch, 1.0F / count);
    const double norm = l3::train::gradient_norm(ops, model.gradients());
    opt.step(model.master_weights(), model.weight_copy(), model.gradients(),
             static_cast<float>(lr.at(step)),
             static_cast<float>(l3::train::clip_factor(norm, 1.0)));
    last = loss.loss / count;
    if (step == 0) first = last;
    if (last < 0.05) break;
  }
  INFO("first loss " << first << ", last loss " << last);
  CHECK(first > 5.0);  // ~ln(512) at random init
  CHECK(last < 0.05);
}

TEST_CASE("a tiny reward model separates a synthetic preference set (accuracy 1.0)",
          "[training][reward]") {
  INFO("seed " << l3::test::test_seed());
  const l3::model::ModelConfig c = l3::model::preset("tiny");
  l3::kernels::CpuOps ops;
  LlamaModel model(c, HeadKind::reward, ops);
  model.initialize(l3::test::test_seed() + 1);
  // Chosen responses end in tokens from [300, 310), rejected ones in [400, 410): a signal at
  // the read-out position, behind a shared random prompt.
  l3::test::Random rnd(31);
  BatchBuilder builder(16, 24, 0);
  for (int p = 0; p < 8; ++p) {
    auto prompt = rnd.integers(8, 256);
    auto chosen = prompt;
    auto rejected = prompt;
    for (int k = 0; k < 4; ++k) {
      chosen.push_back(300 + static_cast<std::int32_t>(rnd.uniform01() * 10));
      rejected.push_back(400 + static_cast<std::int32_t>(rnd.uniform01() * 10));
    }
    REQUIRE(builder.add_pair(chosen, rejected));
  }
  const Batch batch = builder.finish();
  l3::train::AdamW opt(ops, model.layout(), {0.9F, 0.95F, 1e-8F, 0.0F});
  double accuracy = 0;
  for (int step = 0; step < 200 && accuracy < 1.0; ++step) {
    model.zero_gradients();
    const auto out = l3::train::BradleyTerryLoss(model).forward_backward(batch, 1.0F / 8.0F, 0.0);
    opt.step(model.master_weights(), model.weight_copy(), model.gradients(), 1e-3F, 1.0F);
    accuracy =
        static_cast<double>(l3::train::BradleyTerryLoss(model).forward(batch, 0.0).stats.correct) /
        8.0;
  }
  CHECK(accuracy == 1.0);
  const auto final_out = l3::train::BradleyTerryLoss(model).forward(batch, 0.0);
  CHECK(final_out.stats.margin > 0);
}
