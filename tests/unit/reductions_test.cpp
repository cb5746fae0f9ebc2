#include "kernels/cpu/reductions.hpp"

#include <omp.h>

#include "catch.hpp"
#include "numeric_support.hpp"

TEST_CASE("sum of squares: exact in double and independent of how it is called", "[kernels]") {
  INFO("seed " << l3::test::test_seed());
  l3::test::Random rnd(40);
  const auto x = rnd.normal(100003);
  double expected = 0;
  for (const float v : x) expected += double(v) * v;
  const double got = l3::kernels::cpu::sum_squares(x);
  CHECK(got == Approx(expected).epsilon(1e-12));
  CHECK(l3::kernels::cpu::sum_squares(x) == got);  // deterministic
  CHECK(l3::kernels::cpu::sum_squares(std::span<const float>{}) == 0.0);
  const std::vector<float> three = {3.0F};
  CHECK(l3::kernels::cpu::sum_squares(three) == 9.0);
}
