// GRPO's clipped policy loss: the op against the fp64 formulas of kernels/ops.hpp
// (PolicyLossArgs) with and without old log-probabilities, a KL term, advantages of both signs
// and zero, ratios on both sides of an asymmetric clip range; its gradient against finite
// differences; the shape checks and an empty call. Importance sampling of the generator's
// probabilities (TRL's vllm_importance_sampling_*) in its four modes, bounds hit and not hit,
// against fp64 and finite differences, and by hand. And the fused lm_head's per-row entropies
// against fp64.
#include "kernels/cpu/policy_loss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "numeric_support.hpp"

using l3::kernels::ConstTensorView;
using l3::kernels::TensorView;
using l3::test::rel_error;

namespace {

// The per-row inputs in fp64 (empty: absent), and what the formulas give for them.
struct PolicyInputs {
  std::vector<double> old_logps, ref_row_loss, sampled, entropy;
  std::vector<double> advantages, weights;
  double epsilon_low = 0.2, epsilon_high = 0.2, beta = 0.0;
};

struct PolicyReference {
  double loss = 0, kl = 0, low = 0, high = 0, entropy = 0, largest = 0;
};

// Naive fp64 evaluation of PolicyLossArgs's formulas at row losses `x`; `old` is the detached
// old log-probability (the policy's own at the point of evaluation when old_logps is absent).
PolicyReference policy_reference(const std::vector<double>& x, const std::vector<double>& old,
                                 const PolicyInputs& in) {
  PolicyReference r;
  for (std::size_t c = 0; c < x.size(); ++c) {
    const double logp = -x[c];
    const double ratio = std::exp(logp - old[c]);
    const double clipped = std::clamp(ratio, 1 - in.epsilon_low, 1 + in.epsilon_high);
    const double a = in.advantages[c];
    double kl = 0;
    if (!in.ref_row_loss.empty()) {
      const double d = -in.ref_row_loss[c] - logp;
      kl = std::exp(d) - d - 1;
    }
    r.loss += in.weights[c] * (-std::min(ratio * a, clipped * a) + in.beta * kl);
    r.kl += kl;
    r.low += ratio < 1 - in.epsilon_low && a < 0 ? 1 : 0;
    r.high += ratio > 1 + in.epsilon_high && a > 0 ? 1 : 0;
    if (!in.entropy.empty()) r.entropy += in.entropy[c];
    if (!in.sampled.empty()) r.largest = std::max(r.largest, std::abs(logp - in.sampled[c]));
  }
  return r;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

template <typename T>
TensorView view_of(std::vector<T>& v) {
  return TensorView(std::span<T>(v));
}
template <typename T>
ConstTensorView const_view(const std::vector<T>& v) {
  return ConstTensorView(std::span<const T>(v));
}

}  // namespace

TEST_CASE("GRPO policy loss: fp64 formulas, metrics, finite differences", "[policy_loss]") {
  INFO("seed " << l3::test::test_seed());
  l3::test::Random rnd(61);
  const std::size_t rows = 60;
  const double epsilon_low = 0.2;
  const double epsilon_high = 0.28;  // DAPO's clip-higher
  const auto row_loss = rnd.uniform(rows, 0.1F, 3.0F);
  auto advantages = rnd.uniform(rows, -2.0F, 2.0F);
  for (std::size_t c = 0; c < rows; c += 9) advantages[c] = 0.0F;
  const auto weights = rnd.uniform(rows, 0.0F, 0.2F);
  // Old log-probabilities within +-0.6 of the policy's: ratios 0.55 .. 1.8, on both sides of the
  // clip range and inside it; none within 2e-3 of a bound (finite differences stay on one side).
  std::vector<float> old_logps(rows);
  const auto shift = rnd.uniform(rows, -0.6F, 0.6F);
  for (std::size_t c = 0; c < rows; ++c) {
    float old = -row_loss[c] + shift[c];
    for (const double bound : {1 - epsilon_low, 1 + epsilon_high}) {
      const double ratio = std::exp(-static_cast<double>(row_loss[c]) - old);
      if (std::abs(ratio - bound) < 2e-3) old += 0.01F;
    }
    old_logps[c] = old;
  }
  const auto ref_shift = rnd.uniform(rows, -0.5F, 0.5F);
  const auto sampled_shift = rnd.uniform(rows, -0.01F, 0.01F);
  std::vector<float> ref_row_loss(rows), sampled(rows);
  for (std::size_t c = 0; c < rows; ++c) {
    ref_row_loss[c] = row_loss[c] - ref_shift[c];
    sampled[c] = -row_loss[c] + sampled_shift[c];
  }
  const auto entropy = rnd.uniform(rows, 0.0F, 4.0F);
  const auto x = widen(row_loss);
  std::vector<double> own(rows);  // the policy's own log-probabilities, detached
  for (std::size_t c = 0; c < rows; ++c) own[c] = -x[c];

  const bool with_old = GENERATE(false, true);
  const bool with_ref = GENERATE(false, true);
  const double beta = GENERATE(0.0, 0.04);
  INFO("old_logps " << with_old << ", ref_row_loss " << with_ref << ", beta " << beta);
  PolicyInputs in{.old_logps = with_old ? widen(old_logps) : std::vector<double>{},
                  .ref_row_loss = with_ref ? widen(ref_row_loss) : std::vector<double>{},
                  .sampled = widen(sampled),
                  .entropy = widen(entropy),
                  .advantages = widen(advantages),
                  .weights = widen(weights),
                  .epsilon_low = epsilon_low,
                  .epsilon_high = epsilon_high,
                  .beta = beta};
  const std::vector<double>& old = with_old ? in.old_logps : own;
  const PolicyReference want = policy_reference(x, old, in);
  if (with_old) {  // the data covers every case of the clip
    CHECK(want.low >= 3);
    CHECK(want.high >= 3);
  } else {  // ratio 1: nothing clipped
    CHECK(want.low == 0);
    CHECK(want.high == 0);
  }

  l3::kernels::CpuOps ops;
  // The sums add to what they hold; `largest` keeps the larger.
  std::vector<double> sums = {1.0, 2.0, 3.0, 4.0, 5.0};
  std::vector<double> largest = {1e-6};
  std::vector<float> d_rows(rows, NAN);
  const float grad_scale = 0.5F;
  const std::vector<float> none;
  ops.policy_loss({.sums = view_of(sums),
                   .largest = view_of(largest),
                   .d_rows = view_of(d_rows),
                   .row_loss = const_view(row_loss),
                   .advantages = const_view(advantages),
                   .weights = const_view(weights),
                   .old_logps = const_view(with_old ? old_logps : none),
                   .ref_row_loss = const_view(with_ref ? ref_row_loss : none),
                   .sampled_logps = const_view(sampled),
                   .row_entropy = const_view(entropy),
                   .epsilon_low = epsilon_low,
                   .epsilon_high = epsilon_high,
                   .beta = beta,
                   .grad_scale = grad_scale});
  CHECK(sums[0] - 1.0 == Approx(want.loss).epsilon(1e-12));
  CHECK(sums[1] - 2.0 == Approx(want.kl).epsilon(1e-12).margin(1e-15));
  CHECK(sums[2] - 3.0 == want.low);
  CHECK(sums[3] - 4.0 == want.high);
  CHECK(sums[4] - 5.0 == Approx(want.entropy).epsilon(1e-12));
  CHECK(largest[0] == Approx(want.largest).epsilon(1e-12));
  CHECK(largest[0] > 1e-3);
  if (!with_ref) CHECK(sums[1] == 2.0);

  // d_rows = grad_scale * d(sum L)/d row_loss, the old log-probabilities held (detached).
  const auto fd = l3::test::finite_differences(
      [&](const std::vector<double>& v) { return grad_scale * policy_reference(v, old, in).loss; },
      x, {}, 1e-6);
  CHECK(rel_error(d_rows, fd) < 1e-6);
  // Rows of advantage 0 follow the KL term only.
  for (std::size_t c = 0; c < rows; c += 9) {
    INFO("row " << c);
    const double kl_grad = with_ref ? beta * (std::exp(-ref_row_loss[c] + x[c]) - 1.0) : 0.0;
    CHECK(d_rows[c] == Approx(grad_scale * weights[c] * kl_grad).margin(1e-7));
  }

  // Without d_rows, sampled_logps and row_entropy: the same loss, no entropy, largest untouched.
  std::vector<double> plain(5, 0.0);
  std::vector<double> untouched = {7.0};
  ops.policy_loss({.sums = view_of(plain),
                   .largest = view_of(untouched),
                   .row_loss = const_view(row_loss),
                   .advantages = const_view(advantages),
                   .weights = const_view(weights),
                   .old_logps = const_view(with_old ? old_logps : none),
                   .ref_row_loss = const_view(with_ref ? ref_row_loss : none),
                   .epsilon_low = epsilon_low,
                   .epsilon_high = epsilon_high,
                   .beta = beta,
                   .grad_scale = grad_scale});
  CHECK(plain[0] == Approx(want.loss).epsilon(1e-12));
  CHECK(plain[1] == Approx(want.kl).epsilon(1e-12).margin(1e-15));
  CHECK(plain[2] == want.low);
  CHECK(plain[3] == want.high);
  CHECK(plain[4] == 0.0);
  CHECK(untouched[0] == 7.0);
  // A larger `largest` stays.
  std::vector<float> ignored(rows);
  ops.policy_loss({.sums = view_of(plain),
                   .largest = view_of(untouched),
                   .d_rows = view_of(ignored),
                   .row_loss = const_view(row_loss),
                   .advantages = const_view(advantages),
                   .weights = const_view(weights),
                   .sampled_logps = const_view(sampled)});
  CHECK(untouched[0] == 7.0);
}

TEST_CASE("GRPO policy loss: the clip's cases, one row each", "[policy_loss]") {
  // Ratios 0.5 and 2 (outside [0.8, 1.2]) and 1 (inside), advantages +-1: the clipped term holds
  // the gradient at 0 exactly where the surrogate's minimum is the clipped one.
  struct Case {
    double ratio, advantage;
    bool low, high;
    double loss;  // -min(r A, r' A)
  };
  const Case cases[] = {{0.5, -1.0, true, false, 0.8},    // -min(-0.5, -0.8)
                        {0.5, 1.0, false, false, -0.5},   // -min(0.5, 0.8)
                        {2.0, 1.0, false, true, -1.2},    // -min(2, 1.2)
                        {2.0, -1.0, false, false, 2.0},   // -min(-2, -1.2)
                        {1.0, 1.0, false, false, -1.0},   // inside
                        {1.0, -1.0, false, false, 1.0}};  // inside
  std::vector<float> row_loss, old_logps, advantages;
  for (const Case& c : cases) {
    row_loss.push_back(1.0F);
    old_logps.push_back(static_cast<float>(-1.0 - std::log(c.ratio)));
    advantages.push_back(static_cast<float>(c.advantage));
  }
  const std::vector<float> weights(row_loss.size(), 1.0F);
  l3::kernels::CpuOps ops;
  std::vector<double> sums(5, 0.0);
  std::vector<float> d_rows(row_loss.size());
  ops.policy_loss({.sums = view_of(sums),
                   .d_rows = view_of(d_rows),
                   .row_loss = const_view(row_loss),
                   .advantages = const_view(advantages),
                   .weights = const_view(weights),
                   .old_logps = const_view(old_logps)});
  double loss = 0;
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    INFO("case " << i);
    const Case& c = cases[i];
    loss += c.loss;
    const bool clipped = c.low || c.high;
    CHECK(d_rows[i] == Approx(clipped ? 0.0 : c.advantage * c.ratio).epsilon(1e-6));
  }
  CHECK(sums[0] == Approx(loss).epsilon(1e-6));  // the ratios are rounded through f32
  CHECK(sums[2] == 1.0);
  CHECK(sums[3] == 1.0);
}

TEST_CASE("GRPO policy loss: no rows, and the shape checks", "[policy_loss]") {
  l3::kernels::CpuOps ops;
  std::vector<double> sums = {1.0, 2.0, 3.0, 4.0, 5.0};
  ops.policy_loss({.sums = view_of(sums), .beta = 0.04});
  CHECK((sums == std::vector<double>{1.0, 2.0, 3.0, 4.0, 5.0}));
  // A pass of no rows (a rank's empty micro-batch) with sequence-level importance sampling.
  std::vector<double> eight = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}, maxima = {1.0, 2.0, 3.0};
  ops.policy_loss({.sums = view_of(eight),
                   .largest = view_of(maxima),
                   .importance_sampling = l3::kernels::ImportanceSampling::sequence_mask,
                   .clip_max = 3.0});
  CHECK((eight == std::vector<double>{1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}));
  CHECK((maxima == std::vector<double>{1.0, 2.0, 3.0}));

  std::vector<float> row_loss(4, 1.0F), advantages(4, 1.0F), weights(4, 1.0F), three(3, 0.0F);
  std::vector<double> largest = {0.0}, four_sums(4, 0.0);
  const auto call = [&](std::vector<double>& s, const std::vector<float>& adv,
                        const std::vector<float>& sampled, bool with_largest) {
    ops.policy_loss({.sums = view_of(s),
                     .largest = with_largest ? view_of(largest) : TensorView{},
                     .row_loss = const_view(row_loss),
                     .advantages = const_view(adv),
                     .weights = const_view(weights),
                     .sampled_logps = const_view(sampled)});
  };
  CHECK_NOTHROW(call(sums, advantages, row_loss, true));
  CHECK_THROWS(call(four_sums, advantages, {}, false));   // sums: 5 values
  CHECK_THROWS(call(sums, three, {}, false));             // advantages: C
  CHECK_THROWS(call(sums, advantages, three, true));      // sampled_logps: C when given
  CHECK_THROWS(call(sums, advantages, row_loss, false));  // sampled_logps without `largest`
  CHECK_THROWS(call(sums, {}, {}, false));                // advantages are required
  std::vector<float> float_sums(5, 0.0F);
  CHECK_THROWS(ops.policy_loss({.sums = view_of(float_sums)}));  // sums: f64
  CHECK_THROWS(ops.policy_loss({.sums = view_of(sums), .epsilon_low = -0.1}));
}

namespace {

using l3::kernels::ImportanceSampling;

// The importance-sampling ratios of kernels/ops.hpp's PolicyLossArgs in fp64 (per row), with
// TRL's statistics over the units (completions or rows).
struct Ratios {
  std::vector<double> rho;
  double sum = 0, units = 0, rejected = 0, max = 0;
  double min = std::numeric_limits<double>::infinity();
};

Ratios ratio_reference(const std::vector<double>& old, const std::vector<double>& sampled,
                       const std::vector<std::int32_t>& starts, ImportanceSampling mode,
                       double clip_min, double clip_max) {
  Ratios r;
  r.rho.assign(old.size(), 1.0);
  const bool sequence =
      mode == ImportanceSampling::sequence_mask || mode == ImportanceSampling::sequence_truncate;
  const bool mask =
      mode == ImportanceSampling::sequence_mask || mode == ImportanceSampling::token_mask;
  std::vector<std::pair<std::size_t, std::size_t>> units;
  if (sequence) {
    for (std::size_t k = 0; k + 1 < starts.size(); ++k)
      units.emplace_back(starts[k], starts[k + 1]);
  } else {
    for (std::size_t c = 0; c < old.size(); ++c) units.emplace_back(c, c + 1);
  }
  for (const auto& [begin, end] : units) {
    double log_ratio = 0;
    for (std::size_t c = begin; c < end; ++c) log_ratio += old[c] - sampled[c];
    const double raw = std::exp(log_ratio);
    const bool outside = raw < clip_min || raw > clip_max;
    const double rho = mask ? (outside ? 0.0 : raw) : std::clamp(raw, clip_min, clip_max);
    for (std::size_t c = begin; c < end; ++c) r.rho[c] = rho;
    r.sum += rho;
    r.units += 1;
    r.rejected += outside ? static_cast<double>(end - begin) : 0.0;
    r.max = std::max(r.max, rho);
    r.min = std::min(r.min, rho);
  }
  return r;
}

// The loss of PolicyLossArgs with ratios rho (held: detached) at row losses x.
double weighted_loss(const std::vector<double>& x, const std::vector<double>& old,
                     const std::vector<double>& rho, const PolicyInputs& in) {
  double loss = 0;
  for (std::size_t c = 0; c < x.size(); ++c) {
    const double logp = -x[c];
    const double ratio = std::exp(logp - old[c]);
    const double clipped = std::clamp(ratio, 1 - in.epsilon_low, 1 + in.epsilon_high);
    const double a = in.advantages[c];
    double kl = 0;
    if (!in.ref_row_loss.empty()) {
      const double d = -in.ref_row_loss[c] - logp;
      kl = std::exp(d) - d - 1;
    }
    loss += in.weights[c] * (-std::min(ratio * a, clipped * a) * rho[c] + in.beta * kl);
  }
  return loss;
}

const char* mode_name(ImportanceSampling mode) {
  switch (mode) {
    case ImportanceSampling::token_truncate:
      return "token_truncate";
    case ImportanceSampling::token_mask:
      return "token_mask";
    case ImportanceSampling::sequence_truncate:
      return "sequence_truncate";
    case ImportanceSampling::sequence_mask:
      return "sequence_mask";
    case ImportanceSampling::off:
      break;
  }
  return "off";
}

}  // namespace

TEST_CASE("GRPO policy loss: importance sampling of the generator's probabilities, every mode",
          "[policy_loss]") {
  INFO("seed " << l3::test::test_seed());
  l3::test::Random rnd(63);
  // Completions of these lengths (60 rows), then one with no counted row (ratio exp(0) = 1).
  const std::vector<std::int32_t> lengths = {1, 3, 7, 2, 10, 5, 4, 8, 6, 14, 0};
  std::vector<std::int32_t> starts = {0};
  for (const std::int32_t n : lengths) starts.push_back(starts.back() + n);
  const auto rows = static_cast<std::size_t>(starts.back());
  const auto row_loss = rnd.uniform(rows, 0.1F, 3.0F);
  auto advantages = rnd.uniform(rows, -2.0F, 2.0F);
  const auto weights = rnd.uniform(rows, 0.0F, 0.2F);
  const auto old_shift = rnd.uniform(rows, -0.3F, 0.3F);
  // The generator's log-probabilities within +-1.3 of the policy's: token ratios 0.27 .. 3.7.
  const auto sampled_shift = rnd.uniform(rows, -1.3F, 1.3F);
  const auto ref_shift = rnd.uniform(rows, -0.5F, 0.5F);
  std::vector<float> old_logps(rows), sampled(rows), ref_row_loss(rows);
  for (std::size_t c = 0; c < rows; ++c) {
    old_logps[c] = -row_loss[c] + old_shift[c];
    sampled[c] = -row_loss[c] + sampled_shift[c];
    ref_row_loss[c] = row_loss[c] - ref_shift[c];
  }
  const auto x = widen(row_loss);
  std::vector<double> own(rows);
  for (std::size_t c = 0; c < rows; ++c) own[c] = -x[c];

  const ImportanceSampling mode =
      GENERATE(ImportanceSampling::token_truncate, ImportanceSampling::token_mask,
               ImportanceSampling::sequence_truncate, ImportanceSampling::sequence_mask);
  const bool with_old = GENERATE(false, true);
  // TRL's defaults (clip_max 3, no clip_min), a lower bound too, and no bound (nothing hit).
  const auto [clip_min, clip_max] =
      GENERATE(std::pair{0.0, 3.0}, std::pair{0.5, 3.0},
               std::pair{0.0, std::numeric_limits<double>::infinity()});
  const bool sequence =
      mode == ImportanceSampling::sequence_mask || mode == ImportanceSampling::sequence_truncate;
  INFO(mode_name(mode) << ", old_logps " << with_old << ", clip [" << clip_min << ", " << clip_max
                       << "]");
  PolicyInputs in{.old_logps = with_old ? widen(old_logps) : std::vector<double>{},
                  .ref_row_loss = widen(ref_row_loss),
                  .sampled = widen(sampled),
                  .advantages = widen(advantages),
                  .weights = widen(weights),
                  .epsilon_low = 0.2,
                  .epsilon_high = 0.28,
                  .beta = 0.04};
  const std::vector<double>& old = with_old ? in.old_logps : own;
  const Ratios want = ratio_reference(old, in.sampled, starts, mode, clip_min, clip_max);
  const PolicyReference plain = policy_reference(x, old, in);  // without the ratios
  // The data covers the bounds: hit when there are bounds, never when there are none.
  if (std::isinf(clip_max)) {
    CHECK(want.rejected == 0);
  } else {
    CHECK(want.rejected >= 2);
    CHECK(want.rejected <= static_cast<double>(rows) - 10);
  }
  CHECK(want.units == static_cast<double>(sequence ? lengths.size() : rows));

  l3::kernels::CpuOps ops;
  std::vector<double> sums = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0};
  std::vector<double> largest = {1e-6, 1e-6, 1e-6};
  std::vector<float> d_rows(rows, NAN);
  const float grad_scale = 0.5F;
  const std::vector<float> none;
  const std::vector<std::int32_t> no_starts;
  ops.policy_loss({.sums = view_of(sums),
                   .largest = view_of(largest),
                   .d_rows = view_of(d_rows),
                   .row_loss = const_view(row_loss),
                   .advantages = const_view(advantages),
                   .weights = const_view(weights),
                   .old_logps = const_view(with_old ? old_logps : none),
                   .ref_row_loss = const_view(ref_row_loss),
                   .sampled_logps = const_view(sampled),
                   .completion_starts = const_view(sequence ? starts : no_starts),
                   .epsilon_low = in.epsilon_low,
                   .epsilon_high = in.epsilon_high,
                   .beta = in.beta,
                   .importance_sampling = mode,
                   .clip_min = clip_min,
                   .clip_max = clip_max,
                   .grad_scale = grad_scale});
  const double loss = weighted_loss(x, old, want.rho, in);
  CHECK(sums[0] - 1.0 == Approx(loss).epsilon(1e-12));
  CHECK(loss != Approx(plain.loss).epsilon(1e-3));          // the ratios change the loss
  CHECK(sums[1] - 2.0 == Approx(plain.kl).epsilon(1e-12));  // not the KL
  CHECK(sums[2] - 3.0 == plain.low);
  CHECK(sums[3] - 4.0 == plain.high);
  CHECK(sums[4] == 5.0);
  CHECK(sums[5] - 6.0 == Approx(want.sum).epsilon(1e-12));
  CHECK(sums[6] - 7.0 == want.units);
  CHECK(sums[7] - 8.0 == want.rejected);
  CHECK(largest[0] == Approx(plain.largest).epsilon(1e-12));
  CHECK(largest[1] == Approx(want.max).epsilon(1e-12));
  CHECK(1.0 / largest[2] - 1.0 == Approx(want.min).epsilon(1e-9).margin(1e-12));
  if (mode == ImportanceSampling::token_mask || mode == ImportanceSampling::sequence_mask) {
    CHECK(want.min == (want.rejected > 0 ? 0.0 : want.min));
  } else {
    CHECK(want.min >= clip_min);
    CHECK(want.max <= clip_max);
  }

  // d_rows = grad_scale * d(sum L)/d row_loss with the ratios held (a constant, as TRL's).
  const auto fd = l3::test::finite_differences(
      [&](const std::vector<double>& v) {
        return grad_scale * weighted_loss(v, old, want.rho, in);
      },
      x, {}, 1e-6);
  CHECK(rel_error(d_rows, fd) < 1e-6);
  // A masked row's surrogate is gone: only the KL's gradient is left.
  for (std::size_t c = 0; c < rows; ++c) {
    if (want.rho[c] != 0.0) continue;
    INFO("row " << c);
    const double kl_grad = in.beta * (std::exp(-ref_row_loss[c] + x[c]) - 1.0);
    CHECK(d_rows[c] == Approx(grad_scale * weights[c] * kl_grad).margin(1e-7));
  }
}

TEST_CASE("GRPO policy loss: importance sampling by hand, masks hit and not hit", "[policy_loss]") {
  // Two completions, the policy's log-probability 0 (old: detached, ratio 1), advantage 1, weight
  // 1: the loss is -rho per token. Generator's log-probabilities: completion 0 two tokens of
  // old - sampled = 0.5 and 0.7 (token ratios e^0.5 = 1.65, e^0.7 = 2.01; sequence e^1.2 = 3.32),
  // completion 1 one token of -1.0 (e^-1 = 0.368).
  const std::vector<float> row_loss(3, 0.0F), advantages(3, 1.0F), weights(3, 1.0F);
  const std::vector<float> sampled = {-0.5F, -0.7F, 1.0F};
  const std::vector<std::int32_t> starts = {0, 2, 3};
  const double a = std::exp(0.5), b = std::exp(0.7), s = std::exp(1.2), t = std::exp(-1.0);
  struct Case {
    ImportanceSampling mode;
    double clip_min, clip_max;
    std::vector<double> rho;  // per token
    double rejected;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases = {
      {ImportanceSampling::sequence_mask, 0.0, 3.0, {0.0, 0.0, t}, 2},  // TRL's default
      {ImportanceSampling::sequence_mask, 0.0, 4.0, {s, s, t}, 0},
      {ImportanceSampling::sequence_mask, 0.5, 4.0, {s, s, 0.0}, 1},
      {ImportanceSampling::sequence_truncate, 0.0, 3.0, {3.0, 3.0, t}, 2},
      {ImportanceSampling::sequence_truncate, 0.5, 3.0, {3.0, 3.0, 0.5}, 3},
      {ImportanceSampling::token_mask, 0.0, 3.0, {a, b, t}, 0},
      {ImportanceSampling::token_mask, 0.0, 1.8, {a, 0.0, t}, 1},
      {ImportanceSampling::token_mask, 0.4, inf, {a, b, 0.0}, 1},
      {ImportanceSampling::token_truncate, 0.0, 1.8, {a, 1.8, t}, 1},
      {ImportanceSampling::token_truncate, 0.4, 2.0, {a, 2.0, 0.4}, 2},
      {ImportanceSampling::off, 0.0, inf, {1.0, 1.0, 1.0}, 0},
  };
  l3::kernels::CpuOps ops;
  for (const Case& c : cases) {
    INFO(mode_name(c.mode) << " [" << c.clip_min << ", " << c.clip_max << "]");
    const bool on = c.mode != ImportanceSampling::off;
    const bool sequence = c.mode == ImportanceSampling::sequence_mask ||
                          c.mode == ImportanceSampling::sequence_truncate;
    std::vector<double> sums(on ? 8 : 5, 0.0), largest(on ? 3 : 1, 0.0);
    std::vector<float> d_rows(3);
    ops.policy_loss({.sums = view_of(sums),
                     .largest = view_of(largest),
                     .d_rows = view_of(d_rows),
                     .row_loss = const_view(row_loss),
                     .advantages = const_view(advantages),
                     .weights = const_view(weights),
                     .sampled_logps = const_view(sampled),
                     .completion_starts = sequence ? const_view(starts) : ConstTensorView{},
                     .importance_sampling = c.mode,
                     .clip_min = c.clip_min,
                     .clip_max = c.clip_max});
    CHECK(sums[0] == Approx(-(c.rho[0] + c.rho[1] + c.rho[2])).epsilon(1e-6));
    for (std::size_t r = 0; r < 3; ++r) CHECK(d_rows[r] == Approx(c.rho[r]).epsilon(1e-6));
    if (!on) continue;
    // The units' ratios: one per completion, or per token.
    const std::vector<double> units = sequence ? std::vector<double>{c.rho[0], c.rho[2]} : c.rho;
    double sum = 0;
    for (const double u : units) sum += u;
    CHECK(sums[5] == Approx(sum).epsilon(1e-6));
    CHECK(sums[6] == static_cast<double>(units.size()));
    CHECK(sums[7] == c.rejected);
    CHECK(largest[1] == Approx(*std::max_element(units.begin(), units.end())).epsilon(1e-6));
    CHECK(1.0 / largest[2] - 1.0 ==
          Approx(*std::min_element(units.begin(), units.end())).epsilon(1e-6).margin(1e-12));
  }
}

TEST_CASE("GRPO policy loss: importance sampling's shape checks", "[policy_loss]") {
  l3::kernels::CpuOps ops;
  const std::vector<float> ones(4, 1.0F);
  const std::vector<std::int32_t> starts = {0, 1, 4}, bad_end = {0, 1, 3}, unsorted = {0, 3, 1, 4};
  std::vector<double> sums(8, 0.0), five(5, 0.0), largest(3, 0.0), one(1, 0.0);
  const auto call = [&](std::vector<double>& s, std::vector<double>& l, ImportanceSampling mode,
                        const std::vector<std::int32_t>* st, bool with_sampled = true,
                        double clip_min = 0.0, double clip_max = 3.0) {
    ops.policy_loss({.sums = view_of(s),
                     .largest = view_of(l),
                     .row_loss = const_view(ones),
                     .advantages = const_view(ones),
                     .weights = const_view(ones),
                     .sampled_logps = with_sampled ? const_view(ones) : ConstTensorView{},
                     .completion_starts = st != nullptr ? const_view(*st) : ConstTensorView{},
                     .importance_sampling = mode,
                     .clip_min = clip_min,
                     .clip_max = clip_max});
  };
  const auto seq = ImportanceSampling::sequence_mask;
  const auto tok = ImportanceSampling::token_truncate;
  CHECK_NOTHROW(call(sums, largest, seq, &starts));
  CHECK_NOTHROW(call(sums, largest, tok, nullptr));
  CHECK_THROWS(call(five, largest, tok, nullptr));                  // sums: 8 values
  CHECK_THROWS(call(sums, one, tok, nullptr));                      // largest: 3 values
  CHECK_THROWS(call(sums, largest, tok, nullptr, false));           // needs sampled_logps
  CHECK_THROWS(call(sums, largest, seq, nullptr));                  // needs completion_starts
  CHECK_THROWS(call(sums, largest, tok, &starts));                  // only for sequence_*
  CHECK_THROWS(call(sums, largest, seq, &bad_end));                 // ends at C
  CHECK_THROWS(call(sums, largest, seq, &unsorted));                // ascending
  CHECK_THROWS(call(sums, largest, tok, nullptr, true, 2.0, 1.0));  // clip_min > clip_max
  CHECK_THROWS(call(sums, largest, tok, nullptr, true, -1.0, 1.0));
}

TEST_CASE("fused lm_head: per-row entropies of the softmax", "[policy_loss][kernels]") {
  INFO("seed " << l3::test::test_seed());
  l3::test::Random rnd(62);
  const std::int64_t n = 7;
  const std::int64_t hidden = 5;
  const std::int64_t vocab = 13;
  const auto h = rnd.normal(n * hidden, 1.5F);
  const auto w = rnd.normal(vocab * hidden);
  const std::vector<std::int32_t> rows = {0, 2, 3, 5, 6};
  const std::vector<std::int32_t> targets = {3, 12, 0, 7, 7};
  const std::size_t counted = rows.size();
  // fp64: H = logsumexp(z) - sum_v softmax(z)_v z_v
  std::vector<double> want(counted);
  for (std::size_t c = 0; c < counted; ++c) {
    std::vector<double> z(static_cast<std::size_t>(vocab));
    for (std::int64_t v = 0; v < vocab; ++v) {
      double dot = 0;
      for (std::int64_t k = 0; k < hidden; ++k) {
        dot += static_cast<double>(h[static_cast<std::size_t>(rows[c] * hidden + k)]) *
               static_cast<double>(w[static_cast<std::size_t>(v * hidden + k)]);
      }
      z[static_cast<std::size_t>(v)] = dot;
    }
    const double max = *std::max_element(z.begin(), z.end());
    double sum = 0;
    double weighted = 0;
    for (const double zv : z) {
      sum += std::exp(zv - max);
      weighted += std::exp(zv - max) * zv;
    }
    want[c] = max + std::log(sum) - weighted / sum;
    CHECK(want[c] > 0.05);  // far from a one-hot softmax: the test sees the formula
  }
  // One block, and blocks of one row, with and without the backward.
  for (const std::int64_t block_bytes : {l3::kernels::cpu::kLogitBlockBytes, vocab * 4}) {
    INFO("block bytes " << block_bytes);
    std::vector<float> entropy(counted, NAN), row_loss(counted), plain_loss(counted);
    const auto sum = l3::kernels::cpu::lm_head_cross_entropy(
        {}, {}, h, w, rows, targets, vocab, hidden, 1.0F, {.loss = row_loss, .entropy = entropy},
        block_bytes);
    CHECK(rel_error(entropy, want) < 1e-5);
    for (std::size_t c = 0; c < counted; ++c) CHECK(entropy[c] == Approx(want[c]).epsilon(1e-5));
    // The losses are those of a call without entropies.
    const auto plain = l3::kernels::cpu::lm_head_cross_entropy(
        {}, {}, h, w, rows, targets, vocab, hidden, 1.0F, {.loss = plain_loss}, block_bytes);
    CHECK(sum.loss == Approx(plain.loss).epsilon(1e-6));
    CHECK(rel_error(row_loss, plain_loss) < 1e-6);
    // With the backward: the same entropies and gradients.
    std::vector<float> dh(n * hidden), dw(vocab * hidden, 0.0F), dh0(n * hidden),
        dw0(vocab * hidden, 0.0F), entropy2(counted, NAN);
    (void)l3::kernels::cpu::lm_head_cross_entropy(dh, dw, h, w, rows, targets, vocab, hidden, 0.5F,
                                                  {.entropy = entropy2}, block_bytes);
    (void)l3::kernels::cpu::lm_head_cross_entropy(dh0, dw0, h, w, rows, targets, vocab, hidden,
                                                  0.5F, {}, block_bytes);
    CHECK(rel_error(entropy2, want) < 1e-5);
    CHECK(rel_error(dh, dh0) < 1e-6);
    CHECK(rel_error(dw, dw0) < 1e-6);
  }

  // Through the op, with its shape check.
  l3::kernels::CpuOps ops;
  std::vector<float> entropy(counted, NAN), four(4);
  const auto args = [&](std::vector<float>& out) {
    return l3::kernels::LmHeadCrossEntropyArgs{
        .row_entropy = view_of(out),
        .h = ConstTensorView(std::span<const float>(h)).reshape({n, hidden}),
        .w = ConstTensorView(std::span<const float>(w)).reshape({vocab, hidden}),
        .rows = const_view(rows),
        .targets = const_view(targets)};
  };
  ops.lm_head_cross_entropy(args(entropy));
  CHECK(rel_error(entropy, want) < 1e-5);
  CHECK_THROWS(ops.lm_head_cross_entropy(args(four)));

  // A softmax of equal logits: log V exactly up to fp32 rounding; one far ahead: about 0.
  std::vector<float> flat_h(hidden, 0.0F);
  std::vector<float> one(1);
  (void)l3::kernels::cpu::lm_head_cross_entropy({}, {}, flat_h, w, std::vector<std::int32_t>{0},
                                                std::vector<std::int32_t>{1}, vocab, hidden, 1.0F,
                                                {.entropy = one});
  CHECK(one[0] == Approx(std::log(static_cast<double>(vocab))).epsilon(1e-6));
  std::vector<float> peaked_w(vocab * hidden, 0.0F);
  peaked_w[0] = 200.0F;
  std::vector<float> peaked_h(hidden, 0.0F);
  peaked_h[0] = 1.0F;
  (void)l3::kernels::cpu::lm_head_cross_entropy(
      {}, {}, peaked_h, peaked_w, std::vector<std::int32_t>{0}, std::vector<std::int32_t>{0}, vocab,
      hidden, 1.0F, {.entropy = one});
  CHECK(one[0] == Approx(0.0).margin(1e-30));
}
