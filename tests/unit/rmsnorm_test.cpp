#include "kernels/cpu/rmsnorm.hpp"

#include "catch.hpp"
#include "numeric_support.hpp"
#include "reference_ops.hpp"

namespace ref = l3::test::reference;
using l3::test::rel_error;

TEST_CASE("rmsnorm forward matches fp64", "[kernels][rmsnorm]") {
  INFO("seed " << l3::test::test_seed());
  const std::int64_t rows = 13;
  const std::int64_t hidden = 96;
  const float eps = 1e-5F;
  l3::test::Random rnd(4);
  const auto x = rnd.normal(rows * hidden, 3.0F);
  const auto w = rnd.uniform(hidden, 0.5F, 1.5F);
  std::vector<float> y(x.size());
  std::vector<float> rstd(rows);
  l3::kernels::cpu::rmsnorm(y, rstd, x, w, hidden, eps);
  CHECK(rel_error(y, ref::rmsnorm(l3::test::to_double(x), l3::test::to_double(w), hidden, eps)) <
        1e-6);
}

TEST_CASE("rmsnorm backward matches finite differences", "[kernels][rmsnorm]") {
  INFO("seed " << l3::test::test_seed());
  const std::int64_t rows = 5;
  const std::int64_t hidden = 16;
  const float eps = 1e-5F;
  l3::test::Random rnd(5);
  const auto x = rnd.normal(rows * hidden);
  const auto w = rnd.uniform(hidden, 0.5F, 1.5F);
  const auto dout = rnd.uniform(x.size());
  std::vector<float> y(x.size());
  std::vector<float> rstd(rows);
  l3::kernels::cpu::rmsnorm(y, rstd, x, w, hidden, eps);
  std::vector<float> dx(x.size(), 0.25F);  // dx accumulates
  std::vector<float> dw(hidden, 0.0F);
  l3::kernels::cpu::rmsnorm_backward(dx, dw, dout, x, w, rstd, hidden);
  for (float& g : dx) g -= 0.25F;

  const auto xd = l3::test::to_double(x);
  const auto wd = l3::test::to_double(w);
  const auto fd_x = l3::test::finite_differences(
      [&](const std::vector<double>& xv) {
        return l3::test::weighted_sum(ref::rmsnorm(xv, wd, hidden, eps), dout);
      },
      xd);
  const auto fd_w = l3::test::finite_differences(
      [&](const std::vector<double>& wv) {
        return l3::test::weighted_sum(ref::rmsnorm(xd, wv, hidden, eps), dout);
      },
      wd);
  CHECK(rel_error(dx, fd_x) < 1e-3);
  CHECK(rel_error(dw, fd_w) < 1e-3);
}
