// DPO: the loss kernel against fp64 formulas and finite differences (sigmoid with label
// smoothing, IPO, the beta -> 0 limit), the per-row outputs of the fused lm_head, and the
// whole model's DPO gradients against finite differences of the fp64 reference model.
#include <cmath>
#include <vector>

#include "catch.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/dpo_loss.hpp"
#include "model/llama_model.hpp"
#include "numeric_support.hpp"
#include "reference_model.hpp"
#include "train/objectives/dpo_loss.hpp"

using l3::kernels::cpu::DpoKind;
using l3::kernels::cpu::RowRange;
using l3::model::Batch;
using l3::model::BatchBuilder;
using l3::test::rel_error;

namespace {

double log_sigmoid(double x) { return -std::log1p(std::exp(-x)); }

// The fp64 DPO loss of pairs whose policy log-probabilities are given (sums, or means for IPO).
double dpo_reference(const std::vector<double>& policy, const std::vector<double>& reference,
                     double beta, double eps, DpoKind kind) {
  const std::size_t pairs = policy.size() / 2;
  double total = 0;
  for (std::size_t p = 0; p < pairs; ++p) {
    const double h = (policy[p] - reference[p]) - (policy[pairs + p] - reference[pairs + p]);
    total += kind == DpoKind::sigmoid
                 ? -(1 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h)
                 : (h - 1 / (2 * beta)) * (h - 1 / (2 * beta));
  }
  return total;
}

std::vector<double> sequence_values(const std::vector<double>& rows,
                                    const std::vector<RowRange>& ranges, bool mean) {
  std::vector<double> out;
  for (const RowRange& r : ranges) {
    double s = 0;
    for (int i = r.begin; i < r.end; ++i) s -= rows[static_cast<std::size_t>(i)];
    out.push_back(mean && r.end > r.begin ? s / (r.end - r.begin) : s);
  }
  return out;
}

}  // namespace

TEST_CASE("DPO loss: fp64 formula, metrics, finite differences, label smoothing, IPO", "[dpo]") {
  INFO("seed " << l3::test::test_seed());
  l3::test::Random rnd(41);
  // Three pairs over 14 counted rows; row 13 belongs to no sequence.
  const std::vector<RowRange> ranges = {{0, 2}, {5, 9}, {11, 13}, {2, 5}, {9, 11}, {13, 13}};
  const auto losses = rnd.uniform(14, 0.1F, 3.0F);
  std::vector<double> reference;
  for (const float x : rnd.uniform(6, -8.0F, -1.0F)) reference.push_back(x);
  const std::vector<double> rows(losses.begin(), losses.end());
  for (const DpoKind kind : {DpoKind::sigmoid, DpoKind::ipo}) {
    for (const double eps : {0.0, 0.2}) {
      if (kind == DpoKind::ipo && eps > 0) continue;
      INFO("ipo " << (kind == DpoKind::ipo) << " label smoothing " << eps);
      const double beta = 0.3;
      std::vector<float> d_rows(14, 9.0F);
      const auto stats =
          l3::kernels::cpu::dpo_loss(losses, ranges, reference, beta, eps, kind, 0.25F, d_rows);
      const bool mean = kind == DpoKind::ipo;
      const auto policy = sequence_values(rows, ranges, mean);
      CHECK(stats.loss == Approx(dpo_reference(policy, reference, beta, eps, kind)).epsilon(1e-12));
      int correct = 0;
      double margin = 0;
      double chosen = 0;
      for (std::size_t p = 0; p < 3; ++p) {
        const double c = beta * (policy[p] - reference[p]);
        const double r = beta * (policy[3 + p] - reference[3 + p]);
        correct += c > r ? 1 : 0;
        margin += c - r;
        chosen += c;
      }
      CHECK(stats.correct == correct);
      CHECK(stats.margin == Approx(margin).epsilon(1e-12));
      CHECK(stats.chosen == Approx(chosen).epsilon(1e-12));
      // Gradients with respect to each row's loss, by central differences in fp64.
      std::vector<std::size_t> all(14);
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
      const auto fd = l3::test::finite_differences(
          [&](const std::vector<double>& x) {
            return 0.25 *
                   dpo_reference(sequence_values(x, ranges, mean), reference, beta, eps, kind);
          },
          rows, all, 1e-5);
      CHECK(rel_error(d_rows, fd) < 1e-5);
      CHECK(d_rows[13] == 0.0F);  // a row of no sequence
    }
  }
}

TEST_CASE("DPO loss: log 2 where the policy is the reference, and the beta -> 0 limit", "[dpo]") {
  l3::test::Random rnd(42);
  const std::vector<RowRange> ranges = {{0, 3}, {3, 4}, {4, 8}, {8, 10}};
  const auto losses = rnd.uniform(10, 0.1F, 3.0F);
  std::vector<double> policy(4);
  l3::kernels::cpu::sequence_log_probs(policy, losses, ranges, false);
  const auto same =
      l3::kernels::cpu::dpo_loss(losses, ranges, policy, 0.1, 0.0, DpoKind::sigmoid, 1.0F, {});
  CHECK(same.loss == 2 * std::log(2.0));  // exactly: h = 0
  CHECK(same.correct == 0);               // equal rewards are not a win
  CHECK(same.margin == 0.0);

  // As beta -> 0: loss_p -> log 2 - (1 - 2 eps) beta h_p / 2, and d loss / d h -> -(1 - 2 eps)
  // beta / 2.
  std::vector<double> reference = policy;
  reference[0] -= 1.5;  // h_0 = 1.5
  reference[3] += 0.5;  // h_1 = 0.5 (the rejected sequence of pair 1)
  for (const double eps : {0.0, 0.1}) {
    const double beta = 1e-6;
    std::vector<float> d_rows(10);
    const auto s = l3::kernels::cpu::dpo_loss(losses, ranges, reference, beta, eps,
                                              DpoKind::sigmoid, 1.0F, d_rows);
    const double expected = 2 * std::log(2.0) - (1 - 2 * eps) * beta * (1.5 + 0.5) / 2;
    CHECK(s.loss == Approx(expected).epsilon(1e-11));  // + O(beta^2 h^2)
    // d loss / d row_loss of a chosen row = -(d loss / d h) = (1 - 2 eps) beta / 2.
    CHECK(d_rows[0] == Approx((1 - 2 * eps) * beta / 2).epsilon(1e-5));
    CHECK(d_rows[4] == Approx(-(1 - 2 * eps) * beta / 2).epsilon(1e-5));
  }
}

TEST_CASE("fused lm_head: per-row losses and per-row gradient weights", "[dpo][kernels]") {
  l3::test::Random rnd(43);
  const std::int64_t n = 5;
  const std::int64_t hidden = 6;
  const std::int64_t vocab = 11;
  const auto h = rnd.normal(n * hidden);
  const auto w = rnd.normal(vocab * hidden, 0.5F);
  const std::vector<std::int32_t> rows = {0, 2, 3, 4};
  const std::vector<std::int32_t> targets = {3, 10, 0, 7};
  std::vector<float> row_loss(4);
  const auto sum = l3::kernels::cpu::lm_head_cross_entropy({}, {}, h, w, rows, targets, vocab,
                                                           hidden, 1.0F, {.loss = row_loss});
  double total = 0;
  for (const float x : row_loss) total += x;
  CHECK(total == Approx(sum.loss).epsilon(1e-6));
  // Row weights: the same as one call per row with that row's grad_scale.
  const std::vector<float> scale = {0.5F, -2.0F, 0.0F, 1.25F};
  std::vector<float> dh(n * hidden), dw(vocab * hidden, 0.0F);
  l3::kernels::cpu::lm_head_cross_entropy(dh, dw, h, w, rows, targets, vocab, hidden, 0.5F,
                                          {.scale = scale});
  std::vector<float> dh_each(n * hidden, 0.0F), dw_each(vocab * hidden, 0.0F);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::vector<float> dh1(n * hidden);
    const std::vector<std::int32_t> one_row = {rows[r]};
    const std::vector<std::int32_t> one_target = {targets[r]};
    l3::kernels::cpu::lm_head_cross_entropy(dh1, dw_each, h, w, one_row, one_target, vocab, hidden,
                                            0.5F * scale[r]);
    for (std::size_t i = 0; i < dh1.size(); ++i) dh_each[i] += dh1[i];
  }
  CHECK(rel_error(dh, dh_each) < 1e-6);
  CHECK(rel_error(dw, dw_each) < 1e-6);
}

namespace {

l3::model::ModelConfig dpo_config() {
  l3::model::ModelConfig c = l3::model::preset("tiny");
  c.name = "dpo-check";
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  return c;
}

// One sequence alone in a batch: its fp64 log-probability is minus its summed CE.
Batch alone(const std::vector<std::int32_t>& tokens, const std::vector<std::uint8_t>& mask) {
  BatchBuilder b(1, 12, 0);
  REQUIRE(b.add(tokens, mask) >= 0);
  return b.finish();
}

}  // namespace

TEST_CASE("DPO gradients of the whole model match finite differences", "[model][dpo]") {
  INFO("seed " << l3::test::test_seed());
  const l3::model::ModelConfig c = dpo_config();
  l3::kernels::CpuOps ops;
  l3::model::LlamaModel model(c, l3::model::HeadKind::language_model, ops);
  model.initialize(l3::test::test_seed() + 3);
  auto p = model.parameters().as<float>();
  l3::test::Random rnd(44);
  const auto noise = rnd.normal(p.size(), 0.3F);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += noise[i];

  // Two pairs with prompts (mask 0) and responses (mask 1), packed into two rows of 12.
  struct Sequence {
    std::vector<std::int32_t> tokens;
    std::vector<std::uint8_t> mask;
  };
  auto sequence = [&](std::size_t prompt, std::size_t response) {
    Sequence s{rnd.integers(prompt + response, static_cast<std::int32_t>(c.vocab_size)), {}};
    s.mask.assign(prompt, 0);
    s.mask.resize(prompt + response, 1);
    return s;
  };
  const std::vector<Sequence> chosen = {sequence(3, 3), sequence(2, 4)};
  const std::vector<Sequence> rejected = {sequence(3, 2), sequence(2, 3)};
  BatchBuilder builder(2, 12, 0);
  for (std::size_t k = 0; k < 2; ++k) {
    REQUIRE(builder.add_pair(chosen[k].tokens, rejected[k].tokens, 0.0F,
                             static_cast<std::int64_t>(k), chosen[k].mask, rejected[k].mask));
  }
  const Batch batch = builder.finish();
  const std::vector<double> reference = {-9.0, -7.5, -6.0, -8.25};  // chosen 0, 1; rejected 0, 1

  for (const auto loss : {l3::kernels::PreferenceLoss::sigmoid, l3::kernels::PreferenceLoss::ipo}) {
    const bool ipo = loss == l3::kernels::PreferenceLoss::ipo;
    INFO("ipo " << ipo);
    const l3::model::DpoSettings settings{
        .beta = 0.5, .label_smoothing = ipo ? 0.0 : 0.1, .loss = loss};
    const std::vector<double> params(p.begin(), p.end());
    auto fp64_loss = [&](const std::vector<double>& x) {
      std::vector<double> logps;
      for (const auto* side : {&chosen, &rejected}) {
        for (const Sequence& s : *side) {
          const Batch b = alone(s.tokens, s.mask);
          const double sum = -l3::test::reference::sft_loss(x, model.layout(), b);
          logps.push_back(ipo ? sum / static_cast<double>(b.counted_tokens()) : sum);
        }
      }
      return dpo_reference(logps, reference, settings.beta, settings.label_smoothing,
                           ipo ? DpoKind::ipo : DpoKind::sigmoid);
    };
    model.zero_gradients();
    const l3::train::LossSums sums =
        l3::train::DpoLoss(model, settings, nullptr).forward_backward(batch, 0.5F, reference);
    CHECK(sums.loss == Approx(fp64_loss(params)).epsilon(1e-5));

    const auto sample = l3::test::reference::sample_coordinates(model.layout(), rnd);
    const auto fd = l3::test::finite_differences(
        [&](const std::vector<double>& x) { return 0.5 * fp64_loss(x); }, params, sample, 1e-6);
    std::vector<float> analytic;
    for (const std::size_t i : sample) analytic.push_back(model.gradients().as<float>()[i]);
    CHECK(rel_error(analytic, fd) < 1e-3);
  }

  // The policy as its own reference: exactly log 2 per pair, no pair won.
  const auto own = l3::train::sequence_log_probs(model, batch, false);
  const l3::train::LossSums at_start =
      l3::train::DpoLoss(model, {}, nullptr).forward_backward(batch, 0.5F, own);
  CHECK(at_start.loss == 2 * std::log(2.0));
  CHECK(at_start.correct == 0.0);
}

TEST_CASE("DPO with LoRA: the base model without adapters is the reference", "[model][dpo]") {
  const l3::model::ModelConfig c = dpo_config();
  l3::kernels::CpuOps ops;
  l3::model::LoraConfig lora;
  lora.rank = 2;
  lora.alpha = 4;
  lora.targets = l3::model::parse_lora_targets("q,k,v,o,gate,up,down");
  l3::model::LlamaModel model(c, l3::model::HeadKind::language_model, ops, {.lora = lora});
  model.initialize(l3::test::test_seed() + 4);
  l3::test::Random rnd(45);
  BatchBuilder builder(2, 12, 0);
  const std::vector<std::uint8_t> m5 = {0, 0, 1, 1, 1};
  const std::vector<std::uint8_t> m4 = {0, 0, 1, 1};
  REQUIRE(builder.add_pair(rnd.integers(5, 40), rnd.integers(4, 40), 0.0F, 0, m5, m4));
  REQUIRE(builder.add_pair(rnd.integers(4, 40), rnd.integers(5, 40), 0.0F, 1, m4, m5));
  const Batch batch = builder.finish();
  // Fresh adapters (B = 0) change nothing: the loss is exactly log 2 per pair.
  model.zero_gradients();
  l3::train::DpoLoss dpo(model, {}, nullptr);
  const l3::train::LossSums fresh = dpo.forward_backward(batch, 1.0F, {});
  CHECK(fresh.loss == 2 * std::log(2.0));
  CHECK(fresh.correct == 0.0);
  // With trained (non-zero) adapters the reference is still the base: the loss equals that
  // against the base's log-probabilities given explicitly, bit for bit.
  auto adapters = model.trainable_parameters().as<float>();
  const auto noise = rnd.normal(adapters.size(), 0.2F);
  for (std::size_t i = 0; i < adapters.size(); ++i) adapters[i] += noise[i];
  const auto base = l3::train::sequence_log_probs(model, batch, false, /*adapters=*/false);
  const auto adapted = l3::train::sequence_log_probs(model, batch, false);
  CHECK(base != adapted);
  const double implicit = dpo.forward_backward(batch, 1.0F, {}).loss;
  CHECK(dpo.forward_backward(batch, 1.0F, base).loss == implicit);
  CHECK(implicit != 2 * std::log(2.0));
}
