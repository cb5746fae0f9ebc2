#include "kernels/cpu/swiglu.hpp"

#include "catch.hpp"
#include "numeric_support.hpp"
#include "reference_ops.hpp"

namespace ref = l3::test::reference;
using l3::test::rel_error;

TEST_CASE("swiglu forward and backward", "[kernels][swiglu]") {
  INFO("seed " << l3::test::test_seed());
  const std::size_t n = 257;
  l3::test::Random rnd(6);
  const auto gate = rnd.normal(n, 3.0F);
  const auto up = rnd.normal(n);
  std::vector<float> out(n);
  l3::kernels::cpu::swiglu(out, gate, up);
  const auto gd = l3::test::to_double(gate);
  const auto ud = l3::test::to_double(up);
  CHECK(rel_error(out, ref::swiglu(gd, ud)) < 1e-6);

  const auto dout = rnd.uniform(n);
  std::vector<float> dgate(n);
  std::vector<float> dup(n);
  l3::kernels::cpu::swiglu_backward(dgate, dup, dout, gate, up);
  const auto fd_gate = l3::test::finite_differences(
      [&](const std::vector<double>& g) {
        return l3::test::weighted_sum(ref::swiglu(g, ud), dout);
      },
      gd);
  const auto fd_up = l3::test::finite_differences(
      [&](const std::vector<double>& u) {
        return l3::test::weighted_sum(ref::swiglu(gd, u), dout);
      },
      ud);
  CHECK(rel_error(dgate, fd_gate) < 1e-4);
  CHECK(rel_error(dup, fd_up) < 1e-4);
}
