// LoRA adapters in the model (model/lora_config.hpp): the untrained adapters leave the model
// exactly as it was, their gradients (and a reward model's score head beside them) match finite
// differences of the fp64 model with the adapters folded in, the frozen model has no gradient
// buffer, and dropout's backward follows its forward's masks.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "catch.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/llama_model.hpp"
#include "model/lora_config.hpp"
#include "model/lora_merge.hpp"
#include "numeric_support.hpp"
#include "reference_model.hpp"
#include "train/objectives/bradley_terry_loss.hpp"
#include "train/objectives/language_model_loss.hpp"

using l3::model::Batch;
using l3::model::BatchBuilder;
using l3::model::HeadKind;
using l3::model::LlamaModel;
using l3::model::LoraConfig;
using l3::model::ModelConfig;
using l3::model::ModelOptions;
using l3::test::rel_error;

namespace {

// Two layers, GQA: adapter inputs and outputs of 16 (hidden, q), 8 (kv) and 20 (intermediate).
ModelConfig lora_config_model(bool tied = false) {
  ModelConfig c = l3::model::preset("tiny");
  c.name = "lora-check";
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 20;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.tie_word_embeddings = tied;
  return c;
}

LoraConfig lora_of(int rank, double alpha, std::string_view targets = "q,k,v,o,gate,up,down") {
  LoraConfig lora;
  lora.rank = rank;
  lora.alpha = alpha;
  lora.targets = l3::model::parse_lora_targets(targets);
  return lora;
}

Batch sft_batch(l3::test::Random& rnd, std::int64_t vocab) {
  BatchBuilder builder(2, 12, 0);
  const std::vector<std::uint8_t> m1 = {0, 0, 0, 1, 1, 1, 1};
  const std::vector<std::uint8_t> m2 = {0, 1, 1, 1};
  const std::vector<std::uint8_t> m3 = {0, 0, 1, 1, 1, 1, 1, 1, 1};
  for (const auto* m : {&m1, &m2, &m3}) {
    REQUIRE(builder.add(rnd.integers(m->size(), static_cast<std::int32_t>(vocab)), *m) >= 0);
  }
  return builder.finish();
}

Batch pair_batch(l3::test::Random& rnd, std::int64_t vocab) {
  BatchBuilder builder(2, 10, 0);
  const auto v = static_cast<std::int32_t>(vocab);
  REQUIRE(builder.add_pair(rnd.integers(5, v), rnd.integers(4, v), 0.5F));
  REQUIRE(builder.add_pair(rnd.integers(3, v), rnd.integers(6, v), 0.0F));
  return builder.finish();
}

double max_abs(std::span<const float> v) {
  double m = 0.0;
  for (const float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

std::vector<double> doubles(l3::kernels::TensorView x) {
  const auto v = x.as<float>();
  return {v.begin(), v.end()};
}

// Adds noise to every value of x (B too, so that every path of the adapters carries signal).
void add_noise(l3::kernels::TensorView x, l3::test::Random& rnd, float std) {
  auto v = x.as<float>();
  const auto noise = rnd.normal(v.size(), std);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] += noise[i];
}

}  // namespace

TEST_CASE("the adapter layout: PEFT's tensor names and shapes, one gradient group per block",
          "[model][lora]") {
  const ModelConfig c = lora_config_model();
  const l3::model::ParameterLayout layout(c, HeadKind::reward, lora_of(4, 8.0, "q,v,down"));
  REQUIRE(layout.adapters());
  std::vector<std::string> names;
  for (const auto& t : layout.tensors()) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"model.layers.0.self_attn.q_proj.lora_A.weight",
                                          "model.layers.0.self_attn.q_proj.lora_B.weight",
                                          "model.layers.0.self_attn.v_proj.lora_A.weight",
                                          "model.layers.0.self_attn.v_proj.lora_B.weight",
                                          "model.layers.0.mlp.down_proj.lora_A.weight",
                                          "model.layers.0.mlp.down_proj.lora_B.weight",
                                          "model.layers.1.self_attn.q_proj.lora_A.weight",
                                          "model.layers.1.self_attn.q_proj.lora_B.weight",
                                          "model.layers.1.self_attn.v_proj.lora_A.weight",
                                          "model.layers.1.self_attn.v_proj.lora_B.weight",
                                          "model.layers.1.mlp.down_proj.lora_A.weight",
                                          "model.layers.1.mlp.down_proj.lora_B.weight",
                                          "score.weight"});
  CHECK(layout.find("model.layers.0.self_attn.q_proj.lora_A.weight").shape ==
        std::vector<std::int64_t>{4, 16});
  CHECK(layout.find("model.layers.0.self_attn.v_proj.lora_B.weight").shape ==
        std::vector<std::int64_t>{8, 4});
  CHECK(layout.find("model.layers.1.mlp.down_proj.lora_A.weight").shape ==
        std::vector<std::int64_t>{4, 20});
  CHECK(layout.find("model.layers.1.mlp.down_proj.lora_B.weight").shape ==
        std::vector<std::int64_t>{16, 4});
  // r (in + out) per adapter: q 4 (16 + 16), v 4 (16 + 8), down 4 (20 + 16), then the score head
  CHECK(layout.parameter_count() == 2 * (4 * 32 + 4 * 24 + 4 * 36) + 16);
  const auto groups = layout.gradient_groups();
  REQUIRE(groups.size() == 3);  // block 0, block 1, the score head
  CHECK(groups[0].begin == 0);
  CHECK(groups[1].begin == layout.adapter(1).a[0]);
  CHECK(groups[2].begin == layout.score());
  CHECK(groups[2].end == layout.total());
  CHECK_FALSE(layout.lm_head_tied());
}

TEST_CASE("LoRA options: targets by short or PEFT name, and one-line errors", "[model][lora]") {
  using l3::model::parse_lora_targets;
  CHECK(parse_lora_targets("q,k,v,o,gate,up,down") == 0x7F);
  CHECK(parse_lora_targets("q_proj, v_proj") == parse_lora_targets("q,v"));
  LoraConfig lora = lora_of(8, 16.0, "gate,down");
  CHECK(lora.targets_text() == "gate,down");
  CHECK(lora.scale() == 2.0F);
  lora.rslora = true;
  CHECK(lora.scale() == Approx(16.0 / std::sqrt(8.0)));
  CHECK_THROWS_WITH(parse_lora_targets("q,lm_head"), Catch::Contains("unknown layer 'lm_head'"));
  CHECK_THROWS_WITH(parse_lora_targets(""), Catch::Contains("unknown layer ''"));
  lora.dropout = 1.0;
  CHECK_THROWS_WITH(lora.validate(), Catch::Contains("--lora-dropout"));
  lora.dropout = 0.1;
  lora.alpha = 0.0;
  CHECK_THROWS_WITH(lora.validate(), Catch::Contains("--lora-alpha"));
  lora.rank = -1;
  CHECK_THROWS_WITH(lora.validate(), Catch::Contains("--lora-rank"));
}

TEST_CASE("untrained adapters leave the model exactly as it was", "[model][lora]") {
  for (const bool tied : {false, true}) {
    for (const HeadKind head : {HeadKind::language_model, HeadKind::reward}) {
      INFO("tied " << tied << ", reward " << (head == HeadKind::reward));
      const ModelConfig c = lora_config_model(tied);
      l3::kernels::CpuOps ops;
      LlamaModel base(c, head, ops);
      ModelOptions options;
      options.lora = lora_of(4, 8.0);
      options.lora.dropout = 0.25;  // training passes draw masks: B = 0 still adds exactly 0
      LlamaModel adapted(c, head, ops, options);
      base.initialize(17);
      adapted.initialize(17);
      REQUIRE(doubles(base.parameters()) == doubles(adapted.parameters()));
      // A is drawn (non-zero), B is zero
      CHECK(max_abs(adapted.parameter("model.layers.1.mlp.up_proj.lora_A.weight").as<float>()) >
            0.0);
      CHECK(max_abs(adapted.parameter("model.layers.1.mlp.up_proj.lora_B.weight").as<float>()) ==
            0.0);
      l3::test::Random rnd(40);
      if (head == HeadKind::language_model) {
        const Batch batch = sft_batch(rnd, c.vocab_size);
        base.zero_gradients();
        adapted.zero_gradients();
        adapted.set_dropout_draw({.seed = 5});
        CHECK(l3::train::LanguageModelLoss(adapted).forward_backward(batch, 0.1F).loss ==
              l3::train::LanguageModelLoss(base).forward_backward(batch, 0.1F).loss);
        CHECK(l3::train::LanguageModelLoss(adapted).forward(batch).loss ==
              l3::train::LanguageModelLoss(base).forward(batch).loss);
        CHECK(adapted.logits(batch) == base.logits(batch));
      } else {
        const Batch batch = pair_batch(rnd, c.vocab_size);
        const auto a = l3::train::BradleyTerryLoss(adapted).forward_backward(batch, 0.5F, 0.01);
        const auto b = l3::train::BradleyTerryLoss(base).forward_backward(batch, 0.5F, 0.01);
        CHECK(a.stats.loss == b.stats.loss);
        CHECK(a.chosen == b.chosen);
        CHECK(a.rejected == b.rejected);
      }
    }
  }
}

TEST_CASE("the frozen model has no gradient buffer: the adapters' is all", "[model][lora]") {
  const ModelConfig c = lora_config_model();
  l3::kernels::CpuOps ops;
  ModelOptions options;
  options.lora = lora_of(2, 4.0, "q,v");
  const std::int64_t before = ops.allocated_bytes();
  LlamaModel model(c, HeadKind::language_model, ops, options);
  const std::int64_t weights = model.layout().total() * 4;
  const std::int64_t adapters = model.trainable_layout().total() * 4;
  CHECK(model.gradients().numel() == model.trainable_layout().total());
  CHECK(model.master_weights().numel() == model.trainable_layout().total());
  CHECK(model.weight_copy().empty());  // fp32: the adapters are their own master weights
  // weights, adapters, their gradients, and the loss sums: nothing of the model's size twice
  CHECK(ops.allocated_bytes() - before ==
        weights + 2 * adapters + LlamaModel::kLossSumElements * 8);
}

TEST_CASE("adapter and score-head gradients match finite differences of the merged fp64 model",
          "[model][lora]") {
  INFO("seed " << l3::test::test_seed());
  struct Case {
    HeadKind head;
    bool tied;
    bool rslora;
    std::string_view targets;
    bool recompute;
  };
  for (const Case& k : {Case{HeadKind::language_model, false, false, "q,k,v,o,gate,up,down", false},
                        Case{HeadKind::language_model, true, true, "q,o,down", true},
                        Case{HeadKind::reward, false, false, "k,v,gate,up", false}}) {
    INFO("targets " << k.targets << ", tied " << k.tied << ", rslora " << k.rslora);
    const ModelConfig c = lora_config_model(k.tied);
    l3::kernels::CpuOps ops;
    ModelOptions options;
    options.recompute = k.recompute;
    options.lora = lora_of(3, 6.0, k.targets);
    options.lora.rslora = k.rslora;
    LlamaModel model(c, k.head, ops, options);
    model.initialize(l3::test::test_seed());
    l3::test::Random rnd(41);
    add_noise(model.parameters(), rnd, 0.3F);
    add_noise(model.trainable_parameters(), rnd, 0.3F);
    const std::vector<double> base = doubles(model.parameters());
    const std::vector<double> adapters = doubles(model.trainable_parameters());
    const auto& layout = model.layout();
    const auto& adapter_layout = model.trainable_layout();

    model.zero_gradients();
    std::function<double(const std::vector<double>&)> loss_of;
    double loss = 0.0;
    if (k.head == HeadKind::language_model) {
      const Batch batch = sft_batch(rnd, c.vocab_size);
      const auto count = static_cast<double>(batch.counted_tokens());
      loss = l3::train::LanguageModelLoss(model)
                 .forward_backward(batch, static_cast<float>(1.0 / count))
                 .loss;
      loss_of = [&, batch, count](const std::vector<double>& x) {
        const auto merged = l3::test::reference::merge_adapters(base, layout, x, adapter_layout);
        return l3::test::reference::sft_loss(merged, layout, batch) / count;
      };
      CHECK(loss / count == Approx(loss_of(adapters)).epsilon(1e-5));
    } else {
      const Batch batch = pair_batch(rnd, c.vocab_size);
      loss = l3::train::BradleyTerryLoss(model).forward_backward(batch, 0.5F, 0.05).stats.loss;
      loss_of = [&, batch](const std::vector<double>& x) {
        const auto merged = l3::test::reference::merge_adapters(base, layout, x, adapter_layout);
        return 0.5 * l3::test::reference::reward_loss(merged, layout, batch, 0.05);
      };
      CHECK(0.5 * loss == Approx(loss_of(adapters)).epsilon(1e-5));
    }
    const auto sample = l3::test::reference::sample_coordinates(adapter_layout, rnd);
    const auto fd = l3::test::finite_differences(loss_of, adapters, sample, 1e-6);
    std::vector<float> analytic;
    for (const std::size_t i : sample) analytic.push_back(model.gradients().as<float>()[i]);
    CHECK(rel_error(analytic, fd) < 1e-3);
  }
}

TEST_CASE("LoRA dropout: its backward follows the forward's masks, evaluation draws none",
          "[model][lora]") {
  INFO("seed " << l3::test::test_seed());
  const ModelConfig c = lora_config_model();
  l3::kernels::CpuOps ops;
  ModelOptions options;
  options.lora = lora_of(3, 6.0);
  options.lora.dropout = 0.3;
  LlamaModel model(c, HeadKind::language_model, ops, options);
  ModelOptions no_dropout = options;
  no_dropout.lora.dropout = 0.0;
  LlamaModel plain(c, HeadKind::language_model, ops, no_dropout);
  model.initialize(3);
  l3::test::Random rnd(42);
  add_noise(model.parameters(), rnd, 0.3F);
  add_noise(model.trainable_parameters(), rnd, 0.5F);
  plain.load_parameters(model.parameters().as<float>());
  plain.load_adapters(model.trainable_parameters().as<float>());
  const Batch batch = sft_batch(rnd, c.vocab_size);
  const auto count = static_cast<double>(batch.counted_tokens());

  // Evaluation is the model without dropout; a training pass draws masks from its seed.
  CHECK(l3::train::LanguageModelLoss(model).forward(batch).loss ==
        l3::train::LanguageModelLoss(plain).forward(batch).loss);
  model.set_dropout_draw({.seed = 11});
  const double trained = l3::train::LanguageModelLoss(model).forward_backward(batch, 1.0F).loss;
  CHECK(trained != l3::train::LanguageModelLoss(plain).forward(batch).loss);
  model.set_dropout_draw({.seed = 12});
  CHECK(l3::train::LanguageModelLoss(model).forward_backward(batch, 1.0F).loss != trained);

  // The gradient of the loss with seed 11's masks against central differences of that loss
  // (fp32 model: a loose tolerance, on coordinates with a clear gradient; a step of 1e-3: the
  // noisy adapters make the loss curved enough that 1e-2's truncation error failed on most
  // test seeds).
  model.set_dropout_draw({.seed = 11});
  model.zero_gradients();
  CHECK(l3::train::LanguageModelLoss(model)
            .forward_backward(batch, static_cast<float>(1.0 / count))
            .loss == trained);
  const std::vector<float> grads(model.gradients().as<float>().begin(),
                                 model.gradients().as<float>().end());
  auto values = model.trainable_parameters().as<float>();
  std::vector<float> analytic;
  std::vector<double> numeric;
  for (const std::size_t i :
       l3::test::reference::sample_coordinates(model.trainable_layout(), rnd)) {
    if (std::abs(grads[i]) < 1e-3F) continue;
    const float original = values[i];
    const float h = 1e-3F;
    values[i] = original + h;
    const double plus = l3::train::LanguageModelLoss(model).forward_backward(batch, 0.0F).loss;
    values[i] = original - h;
    const double minus = l3::train::LanguageModelLoss(model).forward_backward(batch, 0.0F).loss;
    values[i] = original;
    analytic.push_back(grads[i]);
    numeric.push_back((plus - minus) / (2.0 * static_cast<double>(h)) / count);
  }
  INFO(analytic.size() << " coordinates");
  REQUIRE(analytic.size() >= 10);
  CHECK(rel_error(analytic, numeric) < 2e-2);
}

TEST_CASE("activation recomputation with adapters and dropout gives identical gradients",
          "[model][lora]") {
  const ModelConfig c = lora_config_model();
  l3::kernels::CpuOps ops;
  std::vector<std::vector<float>> results;
  for (const bool recompute : {false, true}) {
    ModelOptions options;
    options.recompute = recompute;
    options.lora = lora_of(2, 4.0);
    options.lora.dropout = 0.2;
    LlamaModel model(c, HeadKind::language_model, ops, options);
    model.initialize(9);
    l3::test::Random rnd(43);
    add_noise(model.trainable_parameters(), rnd, 0.2F);
    model.set_dropout_draw({.seed = 77});
    model.zero_gradients();
    (void)l3::train::LanguageModelLoss(model).forward_backward(sft_batch(rnd, c.vocab_size), 0.05F);
    const auto g = model.gradients().as<float>();
    results.emplace_back(g.begin(), g.end());
  }
  CHECK(results[0] == results[1]);
}

TEST_CASE("merged adapters compute what the adapter model computes", "[model][lora]") {
  INFO("seed " << l3::test::test_seed());
  for (const HeadKind head : {HeadKind::language_model, HeadKind::reward}) {
    const ModelConfig c = lora_config_model();
    l3::kernels::CpuOps ops;
    ModelOptions options;
    options.lora = lora_of(3, 6.0, "q,k,v,o,gate,up,down");
    LlamaModel adapted(c, head, ops, options);
    adapted.initialize(4);
    l3::test::Random rnd(44);
    add_noise(adapted.parameters(), rnd, 0.2F);
    add_noise(adapted.trainable_parameters(), rnd, 0.3F);
    std::vector<float> merged(adapted.parameters().as<float>().begin(),
                              adapted.parameters().as<float>().end());
    l3::model::merge_adapters(merged, adapted.layout(), adapted.trainable_parameters().as<float>(),
                              adapted.trainable_layout());
    LlamaModel plain(c, head, ops);
    plain.load_parameters(merged);
    if (head == HeadKind::language_model) {
      const Batch batch = sft_batch(rnd, c.vocab_size);
      CHECK(l3::train::LanguageModelLoss(plain).forward(batch).loss ==
            Approx(l3::train::LanguageModelLoss(adapted).forward(batch).loss).epsilon(1e-5));
    } else {
      const Batch batch = pair_batch(rnd, c.vocab_size);
      const auto a = l3::train::BradleyTerryLoss(adapted).forward(batch, 0.0);
      const auto b = l3::train::BradleyTerryLoss(plain).forward(batch, 0.0);
      CHECK(b.stats.loss == Approx(a.stats.loss).epsilon(1e-5));
      CHECK(l3::test::rel_error(b.chosen, l3::test::to_double(a.chosen)) < 1e-5);
    }
    // And the fp64 reference's merge agrees with the fp32 one.
    const auto reference = l3::test::reference::merge_adapters(
        doubles(adapted.parameters()), adapted.layout(), doubles(adapted.trainable_parameters()),
        adapted.trainable_layout());
    CHECK(l3::test::rel_error(merged, reference) < 1e-6);
  }
}
