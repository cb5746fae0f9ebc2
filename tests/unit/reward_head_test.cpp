#include <cmath>

#include "catch.hpp"
#include "kernels/cpu/bradley_terry.hpp"
#include "kernels/cpu/gather_dot.hpp"
#include "numeric_support.hpp"

using l3::test::rel_error;

TEST_CASE("score read-out and its gradient", "[kernels][reward]") {
  INFO("seed " << l3::test::test_seed());
  const std::int64_t n = 6;
  const std::int64_t hidden = 5;
  l3::test::Random rnd(13);
  const auto h = rnd.normal(n * hidden);
  const auto w = rnd.normal(hidden);
  const std::vector<std::int32_t> rows = {2, 5, 2};
  std::vector<float> scores(3);
  l3::kernels::cpu::gather_dot(scores, h, w, rows, hidden);
  for (std::size_t p = 0; p < rows.size(); ++p) {
    double dot = 0;
    double magnitude = 0;  // sum of |terms|: the scale of fp32 rounding, even when they cancel
    for (std::int64_t i = 0; i < hidden; ++i) {
      dot += double(h[rows[p] * hidden + i]) * w[i];
      magnitude += std::abs(double(h[rows[p] * hidden + i]) * w[i]);
    }
    CHECK(scores[p] == Approx(dot).margin(1e-6 * magnitude));
  }
  const std::vector<float> ds = {0.5F, -1.0F, 2.0F};
  std::vector<float> dh(h.size(), 0.0F);
  std::vector<float> dw(hidden, 0.0F);
  l3::kernels::cpu::gather_dot_backward(dh, dw, ds, h, w, rows, hidden);
  for (std::int64_t i = 0; i < hidden; ++i) {
    CHECK(dh[2 * hidden + i] == Approx(2.5 * w[i]).epsilon(1e-6));
    CHECK(dh[5 * hidden + i] == Approx(-1.0 * w[i]).epsilon(1e-6));
    CHECK(dh[0 * hidden + i] == 0.0F);
    const double magnitude = 2.5 * std::abs(h[2 * hidden + i]) + std::abs(h[5 * hidden + i]);
    CHECK(dw[i] == Approx(2.5 * h[2 * hidden + i] - h[5 * hidden + i]).margin(1e-6 * magnitude));
  }
}

TEST_CASE("Bradley-Terry loss, metrics and gradients", "[reward]") {
  INFO("seed " << l3::test::test_seed());
  l3::test::Random rnd(14);
  const auto chosen = rnd.normal(8, 2.0F);
  const auto rejected = rnd.normal(8, 2.0F);
  const auto margins = rnd.uniform(8, 0.0F, 1.0F);
  const double center = 0.01;
  std::vector<float> dc(8);
  std::vector<float> dr(8);
  const auto stats =
      l3::kernels::cpu::bradley_terry(chosen, rejected, margins, center, 0.125F, dc, dr);

  auto loss = [&](const std::vector<double>& c, const std::vector<double>& r) {
    double total = 0;
    for (std::size_t p = 0; p < c.size(); ++p) {
      const double z = c[p] - r[p] - margins[p];
      total += -std::log(1.0 / (1.0 + std::exp(-z))) + center * (c[p] + r[p]) * (c[p] + r[p]);
    }
    return total;
  };
  const auto cd = l3::test::to_double(chosen);
  const auto rd = l3::test::to_double(rejected);
  CHECK(stats.loss == Approx(loss(cd, rd)).epsilon(1e-9));
  CHECK(stats.pairs == 8);
  const auto fd_c =
      l3::test::finite_differences([&](const auto& c) { return 0.125 * loss(c, rd); }, cd);
  const auto fd_r =
      l3::test::finite_differences([&](const auto& r) { return 0.125 * loss(cd, r); }, rd);
  CHECK(rel_error(dc, fd_c) < 1e-5);
  CHECK(rel_error(dr, fd_r) < 1e-5);

  // Swapping chosen and rejected flips the sign of the margin metric.
  const auto swapped = l3::kernels::cpu::bradley_terry(rejected, chosen, {}, 0.0, 1.0F, {}, {});
  const auto plain = l3::kernels::cpu::bradley_terry(chosen, rejected, {}, 0.0, 1.0F, {}, {});
  CHECK(swapped.margin == Approx(-plain.margin));
  CHECK(swapped.correct + plain.correct <= 8);

  // Ties count as wrong; extreme scores stay finite.
  const std::vector<float> tie = {1.0F, 100.0F, -100.0F};
  const std::vector<float> other = {1.0F, -100.0F, 100.0F};
  std::vector<float> g1(3);
  std::vector<float> g2(3);
  const auto s = l3::kernels::cpu::bradley_terry(tie, other, {}, 0.0, 1.0F, g1, g2);
  CHECK(s.correct == 1);
  CHECK(std::isfinite(s.loss));
  CHECK(s.loss == Approx(std::log(2.0) + 0.0 + 200.0).epsilon(1e-9));
  for (const float g : g1) CHECK(std::isfinite(g));
}
