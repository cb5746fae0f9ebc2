#include "model/llama_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <string>

#include "catch.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "numeric_support.hpp"
#include "reference_model.hpp"
#include "train/objectives/bradley_terry_loss.hpp"
#include "train/objectives/dpo_loss.hpp"
#include "train/objectives/language_model_loss.hpp"

using l3::model::Batch;
using l3::model::BatchBuilder;
using l3::model::HeadKind;
using l3::model::LlamaModel;
using l3::model::ModelConfig;
using l3::test::rel_error;

namespace {

// Small enough for fp64 finite differences over every tensor kind, with GQA and two layers.
ModelConfig check_config() {
  ModelConfig c = l3::model::preset("tiny");
  c.name = "gradcheck";
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  return c;
}

std::vector<std::int32_t> tokens_of(l3::test::Random& rnd, std::size_t n, std::int64_t vocab) {
  return rnd.integers(n, static_cast<std::int32_t>(vocab));
}

// Two rows of 12: three documents with prompt (mask 0) and response (mask 1) parts, and padding.
Batch sft_batch(l3::test::Random& rnd, std::int64_t vocab) {
  BatchBuilder builder(2, 12, 0);
  const std::vector<std::uint8_t> m1 = {0, 0, 0, 1, 1, 1, 1};
  const std::vector<std::uint8_t> m2 = {0, 1, 1, 1};
  const std::vector<std::uint8_t> m3 = {0, 0, 1, 1, 1, 1, 1, 1, 1};
  REQUIRE(builder.add(tokens_of(rnd, m1.size(), vocab), m1) >= 0);
  REQUIRE(builder.add(tokens_of(rnd, m2.size(), vocab), m2) >= 0);
  REQUIRE(builder.add(tokens_of(rnd, m3.size(), vocab), m3) >= 0);
  return builder.finish();
}

std::vector<double> host_params(const LlamaModel& model) {
  const auto p = model.parameters().as<float>();
  return {p.begin(), p.end()};
}

using l3::test::reference::sample_coordinates;

}  // namespace

TEST_CASE("SFT forward equals the fp64 model and gradients match finite differences", "[model]") {
  INFO("seed " << l3::test::test_seed());
  for (const bool tied : {false, true}) {
    INFO("tied " << tied);
    ModelConfig c = check_config();
    c.tie_word_embeddings = tied;
    l3::kernels::CpuOps ops;
    LlamaModel model(c, HeadKind::language_model, ops);
    model.initialize(l3::test::test_seed());
    // Larger weights than the 0.02 init so that every path carries signal in the check.
    auto p = model.parameters().as<float>();
    l3::test::Random rnd(20);
    const auto noise = rnd.normal(p.size(), 0.3F);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] += noise[i];

    const Batch batch = sft_batch(rnd, c.vocab_size);
    const auto count = static_cast<double>(batch.counted_tokens());
    model.zero_gradients();
    const auto loss = l3::train::LanguageModelLoss(model).forward_backward(
        batch, static_cast<float>(1.0 / count));
    const std::vector<double> params = host_params(model);
    const double expected = l3::test::reference::sft_loss(params, model.layout(), batch);
    CHECK(loss.tokens == batch.counted_tokens());
    CHECK(loss.loss == Approx(expected).epsilon(1e-5));
    CHECK(l3::train::LanguageModelLoss(model).forward(batch).loss ==
          Approx(loss.loss).epsilon(1e-12));

    const auto sample = sample_coordinates(model.layout(), rnd);
    const auto fd = l3::test::finite_differences(
        [&](const std::vector<double>& x) {
          return l3::test::reference::sft_loss(x, model.layout(), batch) / count;
        },
        params, sample, 1e-6);
    std::vector<float> analytic;
    analytic.reserve(sample.size());
    for (const std::size_t i : sample) analytic.push_back(model.gradients().as<float>()[i]);
    CHECK(rel_error(analytic, fd) < 1e-3);
  }
}

TEST_CASE("reward gradients match finite differences", "[model][reward]") {
  INFO("seed " << l3::test::test_seed());
  const ModelConfig c = check_config();
  l3::kernels::CpuOps ops;
  LlamaModel model(c, HeadKind::reward, ops);
  model.initialize(l3::test::test_seed() + 1);
  auto p = model.parameters().as<float>();
  l3::test::Random rnd(21);
  const auto noise = rnd.normal(p.size(), 0.3F);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += noise[i];

  BatchBuilder builder(2, 10, 0);
  REQUIRE(builder.add_pair(tokens_of(rnd, 5, c.vocab_size), tokens_of(rnd, 4, c.vocab_size), 0.5F));
  REQUIRE(builder.add_pair(tokens_of(rnd, 3, c.vocab_size), tokens_of(rnd, 6, c.vocab_size), 0.0F));
  const Batch batch = builder.finish();
  const double center = 0.05;
  model.zero_gradients();
  const auto out = l3::train::BradleyTerryLoss(model).forward_backward(batch, 0.5F, center);
  const std::vector<double> params = host_params(model);
  CHECK(out.stats.loss ==
        Approx(l3::test::reference::reward_loss(params, model.layout(), batch, center))
            .epsilon(1e-5));
  CHECK(out.stats.pairs == 2);

  const auto sample = sample_coordinates(model.layout(), rnd);
  const auto fd = l3::test::finite_differences(
      [&](const std::vector<double>& x) {
        return 0.5 * l3::test::reference::reward_loss(x, model.layout(), batch, center);
      },
      params, sample, 1e-6);
  std::vector<float> analytic;
  analytic.reserve(sample.size());
  for (const std::size_t i : sample) analytic.push_back(model.gradients().as<float>()[i]);
  CHECK(rel_error(analytic, fd) < 1e-3);
}

TEST_CASE("causality: changing token t never changes the logits before t", "[model]") {
  INFO("seed " << l3::test::test_seed());
  const ModelConfig c = l3::model::preset("tiny");
  l3::kernels::CpuOps ops;
  LlamaModel model(c, HeadKind::language_model, ops);
  model.initialize(7);
  l3::test::Random rnd(22);
  const std::int64_t len = 200;  // beyond one attention tile
  const auto tokens = tokens_of(rnd, len, c.vocab_size);
  auto batch_of = [&](const std::vector<std::int32_t>& t) {
    BatchBuilder b(1, len, 0);
    b.add(t, std::vector<std::uint8_t>(t.size(), 1));
    return b.finish();
  };
  const auto base = model.logits(batch_of(tokens));
  for (const std::int64_t t : {std::int64_t{0}, std::int64_t{1}, std::int64_t{130}, len - 1}) {
    auto changed = tokens;
    changed[static_cast<std::size_t>(t)] = (changed[static_cast<std::size_t>(t)] + 1) % 512;
    const auto logits = model.logits(batch_of(changed));
    const auto before = static_cast<std::ptrdiff_t>(t * c.vocab_size);
    CHECK(std::equal(logits.begin(), logits.begin() + before, base.begin()));
    CHECK_FALSE(std::equal(logits.begin() + before, logits.begin() + before + c.vocab_size,
                           base.begin() + before));
  }
}

TEST_CASE("packing: documents packed in one row give the loss and gradients of each alone",
          "[model]") {
  INFO("seed " << l3::test::test_seed());
  const ModelConfig c = l3::model::preset("tiny");
  l3::kernels::CpuOps ops;
  LlamaModel model(c, HeadKind::language_model, ops);
  model.initialize(3);
  l3::test::Random rnd(23);
  const auto d1 = tokens_of(rnd, 20, c.vocab_size);
  const auto d2 = tokens_of(rnd, 31, c.vocab_size);
  std::vector<std::uint8_t> m1(d1.size(), 1);
  std::vector<std::uint8_t> m2(d2.size(), 1);
  m2[1] = m2[2] = 0;

  BatchBuilder packed_builder(1, 64, 0);
  packed_builder.add(d1, m1);
  packed_builder.add(d2, m2);
  const Batch packed = packed_builder.finish();
  model.zero_gradients();
  const auto together = l3::train::LanguageModelLoss(model).forward_backward(packed, 1.0F);
  const auto g = model.gradients().as<float>();
  const std::vector<float> packed_grads(g.begin(), g.end());

  model.zero_gradients();
  double alone = 0;
  for (const auto& [d, m] : {std::pair{d1, m1}, std::pair{d2, m2}}) {
    BatchBuilder b(1, 64, 0);
    b.add(d, m);
    alone += l3::train::LanguageModelLoss(model)
                 .forward_backward(b.finish(), 1.0F)
                 .loss;  // gradients add up
  }
  CHECK(together.loss == Approx(alone).epsilon(1e-5));
  CHECK(rel_error(packed_grads, model.gradients().as<float>()) < 1e-5);
}

TEST_CASE("GQA equals MHA with replicated K/V projections", "[model]") {
  INFO("seed " << l3::test::test_seed());
  const ModelConfig gqa_config = l3::model::preset("tiny");  // 4 heads, 2 kv heads
  ModelConfig mha_config = gqa_config;
  mha_config.n_kv_heads = gqa_config.n_heads;
  l3::kernels::CpuOps ops;
  LlamaModel gqa(gqa_config, HeadKind::language_model, ops);
  LlamaModel mha(mha_config, HeadKind::language_model, ops);
  gqa.initialize(11);
  mha.initialize(12);
  for (const auto& t : gqa.layout().tensors()) {
    const auto src = gqa.parameter(t.name).as<float>();
    const auto dst = mha.parameter(t.name).as<float>();
    if (t.name.find("k_proj") == std::string::npos && t.name.find("v_proj") == std::string::npos) {
      std::copy(src.begin(), src.end(), dst.begin());
      continue;
    }
    const std::int64_t hd = gqa_config.head_dim;
    const std::int64_t hidden = gqa_config.hidden_size;
    const int group = gqa_config.n_heads / gqa_config.n_kv_heads;
    for (int h = 0; h < mha_config.n_heads; ++h)  // MHA head h = GQA kv head h / group
      std::copy_n(src.begin() + (h / group) * hd * hidden, hd * hidden,
                  dst.begin() + h * hd * hidden);
  }
  l3::test::Random rnd(24);
  BatchBuilder b(1, 40, 0);
  b.add(tokens_of(rnd, 25, gqa_config.vocab_size), std::vector<std::uint8_t>(25, 1));
  const Batch batch = b.finish();
  CHECK(rel_error(gqa.logits(batch), mha.logits(batch)) < 1e-6);
}

TEST_CASE("tied embeddings: the lm_head gradient lands in the embedding", "[model]") {
  INFO("seed " << l3::test::test_seed());
  ModelConfig tied_config = l3::model::preset("tiny");
  tied_config.tie_word_embeddings = true;
  const ModelConfig untied_config = l3::model::preset("tiny");
  l3::kernels::CpuOps ops;
  LlamaModel tied(tied_config, HeadKind::language_model, ops);
  LlamaModel untied(untied_config, HeadKind::language_model, ops);
  tied.initialize(5);
  for (const auto& t : untied.layout().tensors()) {
    const auto dst = untied.parameter(t.name).as<float>();
    const auto src =
        tied.parameter(t.name == "lm_head.weight" ? "model.embed_tokens.weight" : t.name)
            .as<float>();
    std::copy(src.begin(), src.end(), dst.begin());
  }
  l3::test::Random rnd(25);
  BatchBuilder b(1, 30, 0);
  b.add(tokens_of(rnd, 30, 512), std::vector<std::uint8_t>(30, 1));
  const Batch batch = b.finish();
  tied.zero_gradients();
  untied.zero_gradients();
  const auto lt = l3::train::LanguageModelLoss(tied).forward_backward(batch, 1.0F);
  const auto lu = l3::train::LanguageModelLoss(untied).forward_backward(batch, 1.0F);
  CHECK(lt.loss == Approx(lu.loss).epsilon(1e-6));
  const auto ge = untied.gradient("model.embed_tokens.weight").as<float>();
  const auto gl = untied.gradient("lm_head.weight").as<float>();
  std::vector<double> sum(ge.size());
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = double(ge[i]) + gl[i];
  CHECK(rel_error(tied.gradient("model.embed_tokens.weight").as<float>(), sum) < 1e-5);
}

TEST_CASE("activation recomputation gives bitwise identical gradients", "[model]") {
  INFO("seed " << l3::test::test_seed());
  const ModelConfig c = l3::model::preset("tiny");
  l3::kernels::CpuOps ops;
  LlamaModel stored(c, HeadKind::language_model, ops, {.recompute = false});
  LlamaModel recomputed(c, HeadKind::language_model, ops, {.recompute = true});
  stored.initialize(9);
  recomputed.initialize(9);
  l3::test::Random rnd(26);
  const Batch batch = sft_batch(rnd, c.vocab_size);
  stored.zero_gradients();
  recomputed.zero_gradients();
  const auto a = l3::train::LanguageModelLoss(stored).forward_backward(batch, 0.1F);
  const auto b = l3::train::LanguageModelLoss(recomputed).forward_backward(batch, 0.1F);
  CHECK(a.loss == b.loss);
  const auto ga = stored.gradients().as<float>();
  const auto gb = recomputed.gradients().as<float>();
  CHECK(std::equal(ga.begin(), ga.end(), gb.begin()));
}

TEST_CASE("training micro-batches add their losses up in backend memory, read once", "[model]") {
  INFO("seed " << l3::test::test_seed());
  const ModelConfig c = check_config();
  l3::kernels::CpuOps ops;
  l3::test::Random rnd(23);
  const Batch a = sft_batch(rnd, c.vocab_size);
  const Batch b = sft_batch(rnd, c.vocab_size);

  LlamaModel single(c, HeadKind::language_model, ops);
  single.initialize(l3::test::test_seed());
  single.zero_gradients();
  const double la = l3::train::LanguageModelLoss(single).forward_backward(a, 0.25F).loss;
  const double lb = l3::train::LanguageModelLoss(single).forward_backward(b, 0.25F).loss;
  const std::vector<double> single_grads(single.gradients().as<float>().begin(),
                                         single.gradients().as<float>().end());

  LlamaModel step(c, HeadKind::language_model, ops);
  step.initialize(l3::test::test_seed());
  step.zero_gradients();
  l3::train::LanguageModelLoss objective(step);
  objective.begin_step();
  objective.train(a, 0.25F);
  // A single call in between (evaluation) leaves the step's sums alone.
  CHECK(l3::train::LanguageModelLoss(step).forward(b).loss == Approx(lb).epsilon(1e-12));
  objective.train(b, 0.25F);
  CHECK(objective.step_sums().loss == la + lb);  // the same additions in the same order
  CHECK(rel_error(step.gradients().as<float>(), single_grads) == 0.0);
  objective.begin_step();
  CHECK(objective.step_sums().loss == 0.0);
  // Evaluation's forward passes add up in their own slot, the step's sums left alone.
  objective.train(a, 0.25F);
  objective.begin_eval();
  objective.evaluate(a);
  objective.evaluate(b);
  l3::train::EvalTotals totals = objective.eval_totals();
  CHECK(totals.loss() == l3::train::LanguageModelLoss(step).forward(a).loss +
                             l3::train::LanguageModelLoss(step).forward(b).loss);
  CHECK(totals.units() == static_cast<double>(a.counted_tokens() + b.counted_tokens()));
  CHECK(objective.step_sums().loss == la);

  // Reward: loss, correct pairs and margins add up the same way.
  LlamaModel reward(c, HeadKind::reward, ops);
  reward.initialize(l3::test::test_seed() + 2);
  BatchBuilder builder(2, 10, 0);
  REQUIRE(builder.add_pair(tokens_of(rnd, 5, c.vocab_size), tokens_of(rnd, 4, c.vocab_size), 0.5F));
  REQUIRE(builder.add_pair(tokens_of(rnd, 3, c.vocab_size), tokens_of(rnd, 6, c.vocab_size), 0.0F));
  const Batch pairs = builder.finish();
  const auto once = l3::train::BradleyTerryLoss(reward).forward_backward(pairs, 0.5F, 0.01);
  l3::train::BradleyTerryLoss reward_objective(reward, 0.01);
  reward_objective.begin_step();
  reward_objective.train(pairs, 0.5F);
  reward_objective.train(pairs, 0.5F);
  const l3::train::LossSums sums = reward_objective.step_sums();
  CHECK(sums.loss == once.stats.loss + once.stats.loss);
  CHECK(sums.correct == static_cast<double>(2 * once.stats.correct));
  CHECK(sums.margin == once.stats.margin + once.stats.margin);
  CHECK(once.stats.margin ==
        Approx((once.chosen[0] - once.rejected[0]) + (once.chosen[1] - once.rejected[1])));
}

namespace {

// A parameter window (model/parameter_window.hpp) serving another buffer's weights, as a
// sharded run's gather buffers will, and recording what the passes ask of it.
class RecordingWindow final : public l3::model::ParameterWindow {
 public:
  RecordingWindow(std::span<const float> weights, std::vector<l3::model::FlatRange> groups)
      : weights_(weights), groups_(std::move(groups)), held_(groups_.size(), 0) {}

  void acquire(std::size_t group, l3::model::Pass pass) override {
    ++held_.at(group);
    events.push_back(fmt::format("+{}{}", group, pass == l3::model::Pass::forward ? 'f' : 'b'));
    std::size_t holding = 0;
    for (const int h : held_) holding += h > 0 ? 1 : 0;
    most_held = std::max(most_held, holding);
  }
  l3::kernels::ConstTensorView parameters(std::int64_t offset, std::int64_t numel) override {
    const l3::model::FlatRange& g = groups_.at(group_of(offset));
    if (held_.at(group_of(offset)) == 0 || offset + numel > g.end) ++reads_outside;
    ++reads;
    return l3::kernels::ConstTensorView(
        weights_.subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(numel)));
  }
  void release(std::size_t group) noexcept override {
    --held_[group];
    events.push_back(fmt::format("-{}", group));
  }

  std::vector<std::string> events;
  std::size_t most_held = 0;  // groups held at the same time, at most
  std::int64_t reads = 0;
  std::int64_t reads_outside = 0;  // of a group not held, or across its end

 private:
  [[nodiscard]] std::size_t group_of(std::int64_t offset) const {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      if (offset >= groups_[g].begin && offset < groups_[g].end) return g;
    }
    return groups_.size();
  }
  std::span<const float> weights_;
  std::vector<l3::model::FlatRange> groups_;
  std::vector<int> held_;
};

// The events of one SFT forward + backward on a model of `layers` blocks: groups 0 (the
// embedding), 1..layers, layers + 1 (the head); lm_head in `lm_head_group`.
std::vector<std::string> sft_events(int layers, std::size_t lm_head_group, bool backward) {
  std::vector<std::string> e;
  const auto use = [&](std::size_t g, char pass) {
    e.push_back(fmt::format("+{}{}", g, pass));
    e.push_back(fmt::format("-{}", g));
  };
  const auto head = static_cast<std::size_t>(layers) + 1;
  for (std::size_t g = 0; g <= head; ++g) use(g, 'f');
  use(lm_head_group, backward ? 'b' : 'f');
  if (!backward) return e;
  use(head, 'b');  // the final norm
  for (std::size_t g = head - 1; g >= 1; --g) use(g, 'b');
  return e;  // the embedding's backward reads no weight
}

}  // namespace

TEST_CASE("a parameter window serves every weight the passes read, one group at a time",
          "[model]") {
  INFO("seed " << l3::test::test_seed());
  l3::kernels::CpuOps ops;
  l3::test::Random rnd(31);
  for (const bool tied : {false, true}) {
    for (const bool recompute : {false, true}) {
      INFO("tied " << tied << ", recompute " << recompute);
      ModelConfig c = check_config();
      c.tie_word_embeddings = tied;
      // `served`'s weights reach `windowed` only through the window: its own are different.
      LlamaModel served(c, HeadKind::language_model, ops, {.recompute = recompute});
      LlamaModel windowed(c, HeadKind::language_model, ops, {.recompute = recompute});
      served.initialize(9);
      windowed.initialize(10);
      RecordingWindow window(served.parameters().as<float>(), served.layout().gradient_groups());
      windowed.set_parameter_window(&window);
      const Batch batch = sft_batch(rnd, c.vocab_size);
      served.zero_gradients();
      windowed.zero_gradients();
      const auto expected = l3::train::LanguageModelLoss(served).forward_backward(batch, 0.5F);
      const auto got = l3::train::LanguageModelLoss(windowed).forward_backward(batch, 0.5F);
      CHECK(got.loss == expected.loss);
      const auto ge = served.gradients().as<float>();
      const auto gw = windowed.gradients().as<float>();
      CHECK(std::equal(ge.begin(), ge.end(), gw.begin()));
      CHECK(window.reads > 0);
      CHECK(window.reads_outside == 0);
      CHECK(window.most_held == 1);
      const std::size_t lm_head_group = tied ? 0 : static_cast<std::size_t>(c.n_layers) + 1;
      CHECK(window.events == sft_events(c.n_layers, lm_head_group, true));

      window.events.clear();
      CHECK(l3::train::LanguageModelLoss(windowed).forward(batch).loss ==
            l3::train::LanguageModelLoss(served).forward(batch).loss);
      CHECK(window.events == sft_events(c.n_layers, lm_head_group, false));

      // A rank without data runs a batch of no rows: the same calls, computing nothing.
      for (const bool backward : {true, false}) {
        window.events.clear();
        l3::train::LanguageModelLoss idle(windowed);
        const Batch none = Batch::none(batch.seq_len);
        const std::vector<float> before(gw.begin(), gw.end());
        if (backward) {
          idle.begin_step();
          idle.train(none, 0.5F);
          CHECK(idle.step_sums().loss == 0.0);
        } else {
          idle.begin_eval();
          idle.evaluate(none);
          CHECK(idle.eval_totals().loss() == 0.0);
        }
        CHECK(window.events == sft_events(c.n_layers, lm_head_group, backward));
        CHECK(std::equal(before.begin(), before.end(), gw.begin()));  // gradients untouched
      }
    }
  }

  // Reward: the score head is read inside the head group.
  const ModelConfig c = check_config();
  LlamaModel served(c, HeadKind::reward, ops);
  LlamaModel windowed(c, HeadKind::reward, ops);
  served.initialize(11);
  windowed.initialize(12);
  RecordingWindow window(served.parameters().as<float>(), served.layout().gradient_groups());
  windowed.set_parameter_window(&window);
  BatchBuilder builder(2, 10, 0);
  REQUIRE(builder.add_pair(tokens_of(rnd, 5, c.vocab_size), tokens_of(rnd, 4, c.vocab_size), 0.5F));
  REQUIRE(builder.add_pair(tokens_of(rnd, 3, c.vocab_size), tokens_of(rnd, 6, c.vocab_size), 0.0F));
  const Batch pairs = builder.finish();
  served.zero_gradients();
  windowed.zero_gradients();
  const auto expected = l3::train::BradleyTerryLoss(served).forward_backward(pairs, 0.5F, 0.01);
  const auto got = l3::train::BradleyTerryLoss(windowed).forward_backward(pairs, 0.5F, 0.01);
  CHECK(got.stats.loss == expected.stats.loss);
  CHECK(got.chosen == expected.chosen);
  const auto ge = served.gradients().as<float>();
  const auto gw = windowed.gradients().as<float>();
  CHECK(std::equal(ge.begin(), ge.end(), gw.begin()));
  CHECK(window.reads_outside == 0);
  CHECK(window.most_held == 1);
  const std::vector<std::string> pass = window.events;
  window.events.clear();
  l3::train::BradleyTerryLoss(windowed, 0.01).train(Batch::none(10), 0.5F);
  CHECK(window.events == pass);

  // DPO: the lm_head read twice (the rows' losses, then their weighted backward); with LoRA the
  // reference's forward pass first. An idle rank makes the same calls.
  for (const bool lora : {false, true}) {
    INFO("DPO, LoRA " << lora);
    l3::model::ModelOptions options;
    if (lora) {
      options.lora.rank = 2;
      options.lora.targets = l3::model::parse_lora_targets("q,v");
    }
    LlamaModel dpo_served(c, HeadKind::language_model, ops, options);
    LlamaModel dpo_windowed(c, HeadKind::language_model, ops, options);
    dpo_served.initialize(13);
    dpo_windowed.initialize(14);
    if (lora) {  // the same adapters, away from zero
      auto a = dpo_served.trainable_parameters().as<float>();
      auto b = dpo_windowed.trainable_parameters().as<float>();
      for (std::size_t i = 0; i < a.size(); ++i) b[i] = a[i] = 0.01F * static_cast<float>(i % 7);
    }
    RecordingWindow dpo_window(dpo_served.parameters().as<float>(),
                               dpo_served.layout().gradient_groups());
    dpo_windowed.set_parameter_window(&dpo_window);
    BatchBuilder dpo_builder(2, 10, 0);
    const std::vector<std::uint8_t> m5 = {0, 0, 1, 1, 1};
    const std::vector<std::uint8_t> m4 = {0, 1, 1, 1};
    REQUIRE(dpo_builder.add_pair(tokens_of(rnd, 5, c.vocab_size), tokens_of(rnd, 4, c.vocab_size),
                                 0.0F, 0, m5, m4));
    const Batch dpo_pairs = dpo_builder.finish();
    const std::vector<double> reference =
        lora ? std::vector<double>{} : std::vector<double>{-20.0, -15.0};
    const l3::train::ReferenceTable table({}, {-20.0}, {-15.0});
    std::array<double, 2> losses{};
    for (std::size_t i = 0; i < 2; ++i) {
      LlamaModel& m = i == 0 ? dpo_served : dpo_windowed;
      m.zero_gradients();
      losses.at(i) = l3::train::DpoLoss(m, {}, lora ? nullptr : &table)
                         .forward_backward(dpo_pairs, 0.5F, reference)
                         .loss;
    }
    CHECK(losses[1] == losses[0]);
    const auto de = dpo_served.gradients().as<float>();
    const auto dw = dpo_windowed.gradients().as<float>();
    CHECK(std::equal(de.begin(), de.end(), dw.begin()));
    CHECK(dpo_window.reads_outside == 0);
    const std::vector<std::string> dpo_pass = dpo_window.events;
    dpo_window.events.clear();
    l3::train::DpoLoss(dpo_windowed, {}, lora ? nullptr : &table).train(Batch::none(10), 0.5F);
    CHECK(dpo_window.events == dpo_pass);
  }
}
