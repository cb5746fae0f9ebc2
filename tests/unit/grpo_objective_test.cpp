// GRPO's objective on the whole model: for each loss type the clipped surrogate's value and its
// gradient against the fp64 reference model and finite differences, with the probability ratio
// inside and outside the clip range (old log-probabilities given), and the policy gradient at a
// ratio of 1 (none given): the gradient of sum_t w_t A_t log pi(t), whatever the loss's value;
// at temperature 0.7 with TRL's tempered log-probabilities (logits / T in every log-probability
// and the entropy), and with the raw ones that --raw-logprobs keeps.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "catch.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/llama_model.hpp"
#include "numeric_support.hpp"
#include "reference_model.hpp"
#include "train/grpo_settings.hpp"
#include "train/objectives/policy_gradient_loss.hpp"

using l3::model::Batch;
using l3::model::BatchBuilder;
using l3::test::rel_error;
using l3::train::PolicyLossType;

namespace {

constexpr std::int64_t kRow = 12;

l3::model::ModelConfig check_config() {
  l3::model::ModelConfig c = l3::model::preset("tiny");
  c.name = "grpo-check";
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  return c;
}

struct Completion {
  std::vector<std::int32_t> tokens;  // prompt + completion
  std::size_t prompt = 0;
  float advantage = 0;
};

// The fp64 log-probability of token k of a sequence (k >= 1) under parameters x, of
// softmax(logits / temperature) (TRL's GRPO divides the logits by the sampling temperature),
// and the entropy of that distribution at the position predicting token k.
struct TokenLogp {
  double logp = 0;
  double entropy = 0;
};
TokenLogp token_logp_entropy(const std::vector<double>& x, const l3::model::ParameterLayout& layout,
                             const Completion& s, std::size_t k, double temperature) {
  std::vector<std::uint8_t> mask(s.tokens.size(), 0);
  mask[k] = 1;
  BatchBuilder b(1, kRow, 0);
  REQUIRE(b.add(s.tokens, mask) >= 0);
  const Batch batch = b.finish();
  const std::vector<double> hidden = l3::test::reference::backbone(x, layout, batch);
  const std::int64_t h = layout.config().hidden_size;
  const std::int64_t v = layout.config().vocab_size;
  for (std::size_t t = 0; t < batch.loss_mask.size(); ++t) {
    if (batch.loss_mask[t] == 0) continue;
    std::vector<double> z(static_cast<std::size_t>(v));
    for (std::int64_t i = 0; i < v; ++i) {
      double dot = 0;
      for (std::int64_t j = 0; j < h; ++j)
        dot += hidden[t * static_cast<std::size_t>(h) + static_cast<std::size_t>(j)] *
               x[static_cast<std::size_t>(layout.lm_head() + i * h + j)];
      z[static_cast<std::size_t>(i)] = dot / temperature;
    }
    const double top = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (const double zi : z) sum += std::exp(zi - top);
    const double lse = top + std::log(sum);
    double entropy = lse;
    for (const double zi : z) entropy -= std::exp(zi - lse) * zi;
    return {z[static_cast<std::size_t>(batch.targets[t])] - lse, entropy};
  }
  FAIL("no counted position");
  return {};
}
double token_logp(const std::vector<double>& x, const l3::model::ParameterLayout& layout,
                  const Completion& s, std::size_t k, double temperature = 1.0) {
  return token_logp_entropy(x, layout, s, k, temperature).logp;
}

// The batch as the rollout builds it (train/grpo/rollout_source.cpp): one completion per row
// (padded) or all end to end in one row (packed), with per-position advantages, weights and
// the old, reference and generator's log-probabilities when given (the latter 0 otherwise).
Batch rollout_batch(const std::vector<Completion>& completions, bool packed,
                    const std::vector<double>& weight, const std::vector<std::vector<double>>* old,
                    const std::vector<std::vector<double>>* ref,
                    const std::vector<std::vector<double>>* sampled = nullptr) {
  const auto count = static_cast<std::int64_t>(completions.size());
  BatchBuilder builder(packed ? 1 : count, packed ? count * kRow : kRow, 0);
  std::vector<std::int64_t> ends;
  for (const Completion& s : completions) {
    std::vector<std::uint8_t> mask(s.tokens.size(), 0);
    std::fill(mask.begin() + static_cast<std::ptrdiff_t>(s.prompt), mask.end(), 1);
    ends.push_back(builder.add(s.tokens, mask));
    if (!packed) builder.end_row();
  }
  Batch batch = packed ? builder.finish_packed(l3::data::kPackedRowAlignment) : builder.finish();
  const auto n = static_cast<std::size_t>(batch.tokens_count());
  batch.advantages.assign(n, 0.0F);
  batch.loss_weights.assign(n, 0.0F);
  batch.sampled_logprobs.assign(n, 0.0F);
  if (old != nullptr) batch.old_logprobs.assign(n, 0.0F);
  if (ref != nullptr) batch.ref_logprobs.assign(n, 0.0F);
  batch.completions = count;
  for (std::size_t s = 0; s < completions.size(); ++s) {
    const auto length =
        static_cast<std::int64_t>(completions[s].tokens.size() - completions[s].prompt);
    for (std::int64_t k = 0; k < length; ++k) {
      const auto t = static_cast<std::size_t>(ends[s] - length + k);
      const auto u = static_cast<std::size_t>(k);
      batch.advantages[t] = completions[s].advantage;
      batch.loss_weights[t] = static_cast<float>(weight[s]);
      if (old != nullptr) batch.old_logprobs[t] = static_cast<float>((*old)[s][u]);
      if (ref != nullptr) batch.ref_logprobs[t] = static_cast<float>((*ref)[s][u]);
      if (sampled != nullptr) batch.sampled_logprobs[t] = static_cast<float>((*sampled)[s][u]);
    }
  }
  return batch;
}

}  // namespace

TEST_CASE("GRPO's loss and gradients of the whole model match fp64 finite differences",
          "[model][grpo]") {
  INFO("seed " << l3::test::test_seed());
  const l3::model::ModelConfig c = check_config();
  l3::kernels::CpuOps ops;
  l3::model::LlamaModel model(c, l3::model::HeadKind::language_model, ops);
  model.initialize(l3::test::test_seed() + 5);
  auto p = model.parameters().as<float>();
  l3::test::Random rnd(47);
  const auto noise = rnd.normal(p.size(), 0.3F);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
  const std::vector<double> params(p.begin(), p.end());

  // Three completions of different lengths and advantages of both signs, one per row.
  std::vector<Completion> completions;
  for (const auto& [prompt, length, advantage] :
       {std::tuple{3, 3, 1.25F}, std::tuple{2, 4, -0.75F}, std::tuple{3, 2, 0.5F}}) {
    const auto n = static_cast<std::size_t>(prompt + length);
    completions.push_back({rnd.integers(n, static_cast<std::int32_t>(c.vocab_size)),
                           static_cast<std::size_t>(prompt), advantage});
  }
  // The old policy: the current log-probabilities shifted, the ratio exp(-shift) inside the clip
  // range for most tokens and outside it, on the side that clips, for two of them.
  std::vector<std::vector<double>> shift;
  for (std::size_t s = 0; s < completions.size(); ++s) {
    std::vector<double> d;
    for (std::size_t k = completions[s].prompt; k < completions[s].tokens.size(); ++k)
      d.push_back(rnd.uniform(1, -0.1F, 0.1F)[0]);
    shift.push_back(d);
  }
  shift[0][1] = -0.5;  // A > 0, ratio e^0.5 > 1.2: clipped high, no gradient
  shift[1][2] = 0.6;   // A < 0, ratio e^-0.6 < 0.8: clipped low, no gradient
  // The reference policy (beta > 0): the current log-probabilities shifted by up to +-0.3.
  std::vector<std::vector<double>> ref_shift;
  for (std::size_t s = 0; s < completions.size(); ++s) {
    std::vector<double> d;
    for (std::size_t k = completions[s].prompt; k < completions[s].tokens.size(); ++k)
      d.push_back(rnd.uniform(1, -0.3F, 0.3F)[0]);
    ref_shift.push_back(d);
  }
  // The old and reference log-probabilities as the rollout gives them: at the sampling
  // temperature (TRL's), unless the run asks for raw ones.
  const auto shifted_logps = [&](double temperature, const std::vector<std::vector<double>>& by) {
    std::vector<std::vector<double>> out(completions.size());
    for (std::size_t s = 0; s < completions.size(); ++s) {
      for (std::size_t k = completions[s].prompt; k < completions[s].tokens.size(); ++k) {
        out[s].push_back(token_logp(params, model.layout(), completions[s], k, temperature) +
                         by[s][k - completions[s].prompt]);
      }
    }
    return out;
  };

  // Importance sampling: the generator's log-probabilities are the old policy's (the current
  // one's without old log-probabilities) minus these, per token. Completion 0's sum is 1.3
  // (sequence ratio e^1.3 = 3.67: masked by clip_max 3) and its second token's 1.2 (e^1.2 = 3.32:
  // truncated to 3); the other ratios stay within [0.5, 3].
  const std::vector<std::vector<double>> generator_gap = {
      {0.2, 1.2, -0.1}, {0.1, -0.2, 0.05, 0.0}, {-0.3, 0.2}};
  using l3::train::ImportanceSamplingMode;
  struct Case {
    PolicyLossType type;
    bool with_old;
    double beta;
    double temperature;     // the sampling temperature
    bool raw = false;       // --raw-logprobs: the log-probabilities of the raw logits
    bool sampling = false;  // importance sampling (TRL's default, off in the other cases)
    ImportanceSamplingMode mode = ImportanceSamplingMode::sequence_mask;
  };
  std::vector<Case> cases;
  for (const PolicyLossType type : {PolicyLossType::dapo, PolicyLossType::grpo,
                                    PolicyLossType::dr_grpo, PolicyLossType::bnpo}) {
    for (const auto& [with_old, beta] :
         {std::pair{true, 0.0}, std::pair{false, 0.0}, std::pair{true, 0.1}}) {
      if (beta > 0 && type != PolicyLossType::dapo && type != PolicyLossType::grpo) continue;
      cases.push_back({type, with_old, beta, 1.0});
    }
  }
  // At the demo's temperature, TRL's way (every log-probability and the entropy of logits / T),
  // the ratio clipped both ways and the KL; and the raw form kept behind --raw-logprobs.
  cases.push_back({PolicyLossType::dapo, true, 0.1, 0.7});
  cases.push_back({PolicyLossType::grpo, false, 0.0, 0.7});
  cases.push_back({PolicyLossType::dapo, true, 0.1, 0.7, true});
  // Importance sampling with TRL's default mode and bounds, and per token, truncated.
  cases.push_back(
      {PolicyLossType::grpo, true, 0.1, 0.7, false, true, ImportanceSamplingMode::sequence_mask});
  cases.push_back(
      {PolicyLossType::dapo, false, 0.0, 1.0, false, true, ImportanceSamplingMode::token_truncate});

  for (const Case& tc : cases) {
    {
      const PolicyLossType type = tc.type;
      const bool with_old = tc.with_old;
      const double beta = tc.beta;
      const double t_logp = tc.raw ? 1.0 : tc.temperature;  // the loss's log-probabilities' T
      INFO("loss type " << l3::train::policy_loss_type_name(type) << ", old log-probabilities "
                        << with_old << ", beta " << beta << ", temperature " << tc.temperature
                        << (tc.raw ? ", raw log-probabilities" : ""));
      const std::vector<std::vector<double>> old = shifted_logps(t_logp, shift);
      const std::vector<std::vector<double>> ref = shifted_logps(t_logp, ref_shift);
      l3::train::GrpoSettings settings;
      settings.beta = beta;
      settings.loss_type = type;
      settings.max_completion_length = 5;
      settings.epsilon = 0.2;
      settings.temperature = tc.temperature;
      settings.tempered_logprobs = !tc.raw;
      settings.importance_sampling_correction = tc.sampling;
      settings.importance_sampling_mode = tc.mode;
      // The ratio of each token (rho, held constant: TRL computes it once per generation
      // batch), from the generator's log-probabilities; 1 without importance sampling.
      const std::vector<std::vector<double>> own =
          shifted_logps(t_logp, std::vector<std::vector<double>>(3, std::vector<double>(4, 0.0)));
      std::vector<std::vector<double>> sampled(3);
      std::vector<std::vector<double>> rho(3);
      double ratio_sum = 0;
      double rejected = 0;
      const bool per_sequence = tc.mode == ImportanceSamplingMode::sequence_mask;
      for (std::size_t s = 0; s < 3; ++s) {
        const std::vector<double>& before = with_old ? old[s] : own[s];
        double gap = 0;
        for (std::size_t k = 0; k < before.size(); ++k) {
          sampled[s].push_back(before[k] - generator_gap[s][k]);
          gap += generator_gap[s][k];
        }
        for (std::size_t k = 0; k < before.size(); ++k) {
          if (!tc.sampling) {
            rho[s].push_back(1.0);
          } else if (per_sequence) {  // sequence_mask, [0, 3]
            const double r = std::exp(gap) > 3.0 ? 0.0 : std::exp(gap);
            rho[s].push_back(r);
            if (k == 0) ratio_sum += r;
            rejected += r == 0.0 ? 1.0 : 0.0;
          } else {  // token_truncate, [0, 3]
            const double raw = std::exp(generator_gap[s][k]);
            rho[s].push_back(std::min(raw, 3.0));
            ratio_sum += std::min(raw, 3.0);
            rejected += raw > 3.0 ? 1.0 : 0.0;
          }
        }
      }
      std::int64_t tokens = 0;
      for (const Completion& s : completions)
        tokens += static_cast<std::int64_t>(s.tokens.size() - s.prompt);
      std::vector<double> weight(3);
      for (std::size_t s = 0; s < 3; ++s) {
        const auto length =
            static_cast<std::int64_t>(completions[s].tokens.size() - completions[s].prompt);
        weight[s] = type == PolicyLossType::grpo   ? 1.0 / static_cast<double>(length)
                    : type == PolicyLossType::bnpo ? 1.0 / static_cast<double>(tokens)
                                                   : 1.0;
      }
      const Batch batch = rollout_batch(completions, false, weight, with_old ? &old : nullptr,
                                        beta > 0 ? &ref : nullptr, &sampled);
      l3::train::PolicyGradientLoss objective(model, settings);
      const std::int64_t units = objective.units(batch);
      CHECK(units == (type == PolicyLossType::dapo      ? tokens
                      : type == PolicyLossType::grpo    ? 3
                      : type == PolicyLossType::dr_grpo ? 15
                                                        : 1));
      const double scale = 1.0 / static_cast<double>(units);

      // fp64: with old log-probabilities, the clipped surrogate; without, a ratio of 1 whose
      // gradient is that of -sum w A log pi. With beta, + beta k3(pi, ref) per token (TRL:
      // exp(ref - logp) - (ref - logp) - 1).
      double kl_sum = 0;
      double entropy_sum = 0;
      auto fp64_loss = [&](const std::vector<double>& x, bool surrogate_only) {
        double total = 0;
        kl_sum = 0;
        entropy_sum = 0;
        for (std::size_t s = 0; s < 3; ++s) {
          const Completion& cs = completions[s];
          for (std::size_t k = cs.prompt; k < cs.tokens.size(); ++k) {
            const TokenLogp tl = token_logp_entropy(x, model.layout(), cs, k, t_logp);
            const double logp = tl.logp;
            entropy_sum += tl.entropy;
            const double a = cs.advantage;
            if (beta > 0) {
              const double d = ref[s][k - cs.prompt] - logp;
              const double kl = std::exp(d) - d - 1.0;
              kl_sum += kl;
              total += weight[s] * beta * kl;
            }
            const double is = rho[s][k - cs.prompt];
            if (!with_old || surrogate_only) {
              total += weight[s] * -a * (surrogate_only ? logp : 1.0) * is;
              continue;
            }
            const double r = std::exp(logp - old[s][k - cs.prompt]);
            const double clipped = std::clamp(r, 0.8, 1.2);
            total += weight[s] * -std::min(r * a, clipped * a) * is;
          }
        }
        return scale * total;
      };
      model.zero_gradients();
      const l3::train::LossSums sums = objective.forward_backward(batch, static_cast<float>(scale));
      CHECK(sums.loss * scale == Approx(fp64_loss(params, false)).epsilon(1e-5));
      CHECK(sums.correct == Approx(kl_sum).epsilon(1e-5));        // the KL's sum over the tokens
      CHECK(sums.extra[0] == Approx(entropy_sum).epsilon(1e-5));  // TRL's entropy, at t_logp
      if (tc.sampling) {
        CHECK(rejected == (per_sequence ? 3.0 : 1.0));  // completion 0, or its second token
        CHECK(sums.extra[1] == Approx(ratio_sum).epsilon(1e-5));
        CHECK(sums.extra[2] == (per_sequence ? 3.0 : static_cast<double>(tokens)));
        CHECK(sums.extra[3] == rejected);
      } else {
        CHECK(sums.extra[1] == 0.0);
        CHECK(sums.extra[2] == 0.0);
      }
      if (with_old) {
        CHECK(sums.chosen == 1.0);  // clipped high
        CHECK(sums.margin == 1.0);  // clipped low
      } else {
        CHECK(sums.chosen == 0.0);
        CHECK(sums.margin == 0.0);
      }
      const auto sample = l3::test::reference::sample_coordinates(model.layout(), rnd);
      const auto fd = l3::test::finite_differences(
          [&](const std::vector<double>& x) { return fp64_loss(x, !with_old); }, params, sample,
          1e-6);
      std::vector<float> analytic;
      for (const std::size_t i : sample) analytic.push_back(model.gradients().as<float>()[i]);
      CHECK(rel_error(analytic, fd) < 1e-3);
    }
  }
}

TEST_CASE("GRPO's completions packed end to end give the padded layout's loss and gradients",
          "[model][grpo]") {
  INFO("seed " << l3::test::test_seed());
  const l3::model::ModelConfig c = check_config();
  l3::kernels::CpuOps ops;
  l3::model::LlamaModel model(c, l3::model::HeadKind::language_model, ops);
  model.initialize(l3::test::test_seed() + 9);
  l3::test::Random rnd(53);
  // Five completions (prompts of 2-4 tokens, completions of 1-8), advantages of both signs, old
  // and reference log-probabilities near the policy's: every term of the loss is exercised.
  std::vector<Completion> completions;
  for (const auto& [prompt, length, advantage] :
       {std::tuple{3, 5, 1.25F}, std::tuple{2, 8, -0.75F}, std::tuple{4, 1, 0.5F},
        std::tuple{2, 6, -1.5F}, std::tuple{3, 3, 0.25F}}) {
    const auto n = static_cast<std::size_t>(prompt + length);
    completions.push_back({rnd.integers(n, static_cast<std::int32_t>(c.vocab_size)),
                           static_cast<std::size_t>(prompt), advantage});
  }
  std::vector<std::vector<double>> old;
  std::vector<std::vector<double>> ref;
  std::vector<std::vector<double>> sampled;  // near the old policy's
  std::vector<double> weight;
  for (const Completion& s : completions) {
    const std::size_t length = s.tokens.size() - s.prompt;
    old.push_back({});
    ref.push_back({});
    sampled.push_back({});
    for (std::size_t k = 0; k < length; ++k) {
      old.back().push_back(-3.7 + rnd.uniform(1, -0.3F, 0.3F)[0]);
      ref.back().push_back(-3.7 + rnd.uniform(1, -0.3F, 0.3F)[0]);
      sampled.back().push_back(old.back().back() + rnd.uniform(1, -0.25F, 0.25F)[0]);
    }
    weight.push_back(1.0 / static_cast<double>(length));  // grpo's per-completion mean
  }
  // Out of bounds: completion 1's ratio e^(8 x 0.3) = 11 > 3, completion 3's first token's
  // e^-1 < 0.5.
  for (std::size_t k = 0; k < sampled[1].size(); ++k) sampled[1][k] = old[1][k] - 0.3;
  sampled[3][0] = old[3][0] + 1.0;
  l3::train::GrpoSettings settings;
  settings.beta = 0.1;
  settings.loss_type = PolicyLossType::grpo;
  settings.max_completion_length = 8;
  settings.temperature = 0.7;
  // Importance sampling (TRL's default, sequence_mask), per completion truncated, per token.
  const auto mode = GENERATE(l3::train::ImportanceSamplingMode::sequence_mask,
                             l3::train::ImportanceSamplingMode::sequence_truncate,
                             l3::train::ImportanceSamplingMode::token_mask);
  INFO("importance sampling " << l3::train::importance_sampling_mode_name(mode));
  settings.importance_sampling_mode = mode;
  settings.importance_sampling_clip_min = 0.5;

  const Batch padded = rollout_batch(completions, false, weight, &old, &ref, &sampled);
  const Batch packed = rollout_batch(completions, true, weight, &old, &ref, &sampled);
  // 5 rows of 12 against one row of the 37 tokens rounded up to 48
  CHECK(padded.tokens_count() == 60);
  CHECK(packed.rows == 1);
  CHECK(packed.tokens_count() == 48);
  CHECK(packed.document_tokens == padded.document_tokens);

  l3::train::PolicyGradientLoss objective(model, settings);
  const auto run = [&](const Batch& batch) {
    model.zero_gradients();
    const l3::train::LossSums sums = objective.forward_backward(batch, 0.2F);
    const auto g = model.gradients().as<float>();
    return std::pair{sums, std::vector<float>(g.begin(), g.end())};
  };
  const auto [a, ga] = run(padded);
  const auto [b, gb] = run(packed);
  // The completions' ratios: one per completion (each its own segment or row), or per token;
  // some out of [0.5, 3].
  CHECK(a.extra[2] == (mode == l3::train::ImportanceSamplingMode::token_mask ? 23.0 : 5.0));
  CHECK(a.extra[3] > 0);
  CHECK(b.extra[1] == Approx(a.extra[1]).epsilon(1e-6));
  CHECK(b.extra[2] == a.extra[2]);
  CHECK(b.extra[3] == a.extra[3]);
  CHECK(b.largest[1] == Approx(a.largest[1]).epsilon(1e-6));
  CHECK(b.largest[2] == Approx(a.largest[2]).epsilon(1e-6));
  CHECK(b.loss == Approx(a.loss).epsilon(1e-6));
  // A rank's micro-batch of no rows (the other ranks' passes have some) adds nothing.
  model.zero_gradients();
  const l3::train::LossSums none = objective.forward_backward(Batch::none(kRow), 0.2F);
  CHECK(none.loss == 0.0);
  CHECK(none.extra[2] == 0.0);
  CHECK(none.largest[2] == 0.0);
  CHECK(b.correct == Approx(a.correct).epsilon(1e-6));    // KL
  CHECK(b.extra[0] == Approx(a.extra[0]).epsilon(1e-6));  // entropy
  CHECK(b.chosen == a.chosen);                            // clipped tokens
  CHECK(b.margin == a.margin);
  double largest = 0;
  double scale = 0;
  for (std::size_t i = 0; i < ga.size(); ++i) {
    largest = std::max(largest, static_cast<double>(std::abs(ga[i] - gb[i])));
    scale = std::max(scale, static_cast<double>(std::abs(ga[i])));
  }
  INFO("largest gradient difference " << largest << " of a largest gradient " << scale);
  CHECK(scale > 0);
  CHECK(largest <= 1e-5 * scale);
}

TEST_CASE("GRPO's step metrics: TRL's importance-sampling names, from the summed values",
          "[model][grpo]") {
  l3::kernels::CpuOps ops;
  l3::model::LlamaModel model(check_config(), l3::model::HeadKind::language_model, ops);
  l3::train::GrpoSettings settings;
  // Sums over the ranks: 4 units whose ratios add up to 3.2 with 6 of 40 tokens masked; the
  // maxima: largest ratio 1.5, smallest 0.25 (1 / (1 + 0.25) = 0.8).
  const l3::train::LossSums sums{
      .loss = 2.0, .extra = {10.0, 3.2, 4.0, 6.0}, .largest = {1e-5, 1.5, 0.8}};
  const auto metric = [](const l3::StepMetrics& m, const std::string& name) {
    for (const auto& [key, value] : m.extra) {
      if (key == name) return value;
    }
    FAIL("no metric " << name);
    return 0.0;
  };
  const auto has = [](const l3::StepMetrics& m, const std::string& prefix) {
    return std::any_of(m.extra.begin(), m.extra.end(),
                       [&](const auto& kv) { return kv.first.rfind(prefix, 0) == 0; });
  };
  {
    l3::train::PolicyGradientLoss objective(model, settings);
    l3::StepMetrics m;
    m.loss_tokens = 40;
    objective.describe_step(sums, 40, m);
    CHECK(metric(m, "logp_mismatch") == 1e-5);
    CHECK(metric(m, "sampling/importance_sampling_ratio/min") == Approx(0.25).epsilon(1e-12));
    CHECK(metric(m, "sampling/importance_sampling_ratio/mean") == Approx(0.8).epsilon(1e-12));
    CHECK(metric(m, "sampling/importance_sampling_ratio/max") == 1.5);
    CHECK(metric(m, "sampling/importance_sampling_masked") == Approx(0.15).epsilon(1e-12));
    CHECK(!has(m, "sampling/importance_sampling_truncated"));
  }
  {
    settings.importance_sampling_mode = l3::train::ImportanceSamplingMode::token_truncate;
    l3::train::PolicyGradientLoss objective(model, settings);
    l3::StepMetrics m;
    m.loss_tokens = 40;
    objective.describe_step(sums, 40, m);
    CHECK(metric(m, "sampling/importance_sampling_truncated") == Approx(0.15).epsilon(1e-12));
    CHECK(!has(m, "sampling/importance_sampling_masked"));
  }
  {
    settings.importance_sampling_correction = false;
    l3::train::PolicyGradientLoss objective(model, settings);
    l3::StepMetrics m;
    m.loss_tokens = 40;
    objective.describe_step(sums, 40, m);
    CHECK(!has(m, "sampling/"));
    CHECK(metric(m, "logp_mismatch") == 1e-5);
  }
}
