#include "kernels/cpu/vector_math.hpp"

#include <cmath>

#include "catch.hpp"

TEST_CASE("exp_approx is within 2 ulp of exp over the softmax range", "[kernels]") {
  double worst = 0;
  for (int step = 0; step <= 175000; ++step) {  // x from -87 to 88 in steps of 0.001
    const auto xf = static_cast<float>(-87.0 + 0.001 * step);
    const double exact = std::exp(static_cast<double>(xf));
    const double rel = std::abs(l3::kernels::cpu::exp_approx(xf) - exact) / exact;
    worst = std::max(worst, rel);
  }
  INFO("worst relative error " << worst);
  CHECK(worst < 2.5e-7);
  CHECK(l3::kernels::cpu::exp_approx(0.0F) == 1.0F);
  CHECK(l3::kernels::cpu::exp_approx(-1000.0F) == 0.0F);
  CHECK(l3::kernels::cpu::exp_approx(-INFINITY) == 0.0F);
  CHECK(std::isfinite(l3::kernels::cpu::exp_approx(1000.0F)));
}

TEST_CASE("softmax row helpers", "[kernels]") {
  std::vector<float> row = {1.0F, 3.0F, 2.0F, -50.0F};
  const auto s = l3::kernels::cpu::exp_row(row.data(), 4);
  CHECK(s.max == 3.0F);
  CHECK(s.sum == Approx(std::exp(-2.0) + 1.0 + std::exp(-1.0) + std::exp(-53.0)).epsilon(1e-6));
  CHECK(row[1] == 1.0F);
  l3::kernels::cpu::scale_row(row.data(), 4, 2.0F);
  CHECK(row[1] == 2.0F);
  std::vector<float> shifted = {0.0F, 1.0F};
  l3::kernels::cpu::exp_shifted_row(shifted.data(), 2, 1.0F);
  CHECK(shifted[1] == 1.0F);
  CHECK(shifted[0] == Approx(std::exp(-1.0)).epsilon(1e-6));
}
