#include "kernels/cpu/matmul.hpp"

#include "catch.hpp"
#include "numeric_support.hpp"
#include "reference_ops.hpp"

namespace ref = l3::test::reference;
using l3::test::rel_error;

TEST_CASE("matmul forward matches fp64, accumulate adds", "[kernels][matmul]") {
  INFO("seed " << l3::test::test_seed());
  const std::int64_t m = 37;
  const std::int64_t n = 29;
  const std::int64_t k = 53;
  l3::test::Random rnd(1);
  const auto x = rnd.uniform(m * k);
  const auto w = rnd.uniform(n * k);
  std::vector<float> y(m * n);
  l3::kernels::cpu::matmul(y, x, w, m, n, k, false);
  const auto expected = ref::matmul(l3::test::to_double(x), l3::test::to_double(w), m, n, k);
  CHECK(rel_error(y, expected) < 1e-6);

  l3::kernels::cpu::matmul(y, x, w, m, n, k, true);
  auto twice = expected;
  for (double& v : twice) v *= 2;
  CHECK(rel_error(y, twice) < 1e-6);
  CHECK_THROWS(l3::kernels::cpu::matmul(y, x, w, m, n, k + 1, false));
}

TEST_CASE("matmul backward matches finite differences", "[kernels][matmul]") {
  INFO("seed " << l3::test::test_seed());
  const std::int64_t m = 7;
  const std::int64_t n = 5;
  const std::int64_t k = 9;
  l3::test::Random rnd(2);
  const auto x = rnd.uniform(m * k);
  const auto w = rnd.uniform(n * k);
  const auto dy = rnd.uniform(m * n);
  std::vector<float> dx(m * k, 0.0F);
  std::vector<float> dw(n * k, 0.5F);  // dw accumulates: start from a known value
  l3::kernels::cpu::matmul_backward(dx, dw, dy, x, w, m, n, k, false);
  for (float& g : dw) g -= 0.5F;

  const auto wd = l3::test::to_double(w);
  const auto xd = l3::test::to_double(x);
  const auto fd_x = l3::test::finite_differences(
      [&](const std::vector<double>& xv) {
        return l3::test::weighted_sum(ref::matmul(xv, wd, m, n, k), dy);
      },
      xd);
  const auto fd_w = l3::test::finite_differences(
      [&](const std::vector<double>& wv) {
        return l3::test::weighted_sum(ref::matmul(xd, wv, m, n, k), dy);
      },
      wd);
  CHECK(rel_error(dx, fd_x) < 1e-4);
  CHECK(rel_error(dw, fd_w) < 1e-4);

  // accumulate_dx adds to what is there
  std::vector<float> dx2(m * k, 1.0F);
  l3::kernels::cpu::matmul_backward(dx2, {}, dy, x, w, m, n, k, true);
  for (std::size_t i = 0; i < dx2.size(); ++i) CHECK(dx2[i] - 1.0F == Approx(dx[i]).margin(1e-5));
}

TEST_CASE("the row-invariant matmul matches fp64 and gives a row the same bits in any call",
          "[kernels][matmul]") {
  INFO("seed " << l3::test::test_seed());
  // K with a tail past the 16 lanes, N with a tail past the 4-column tiles
  const std::int64_t m = 23;
  const std::int64_t n = 31;
  const std::int64_t k = 77;
  l3::test::Random rnd(3);
  const auto x = rnd.uniform(m * k);
  const auto w = rnd.uniform(n * k);
  std::vector<float> y(m * n);
  l3::kernels::cpu::matmul_row_invariant(y, x, w, m, n, k, false);
  const auto expected = ref::matmul(l3::test::to_double(x), l3::test::to_double(w), m, n, k);
  CHECK(rel_error(y, expected) < 1e-6);
  std::vector<float> twice = y;
  l3::kernels::cpu::matmul_row_invariant(twice, x, w, m, n, k, true);
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(twice[i] == y[i] + y[i]);

  // Any run of rows, alone or with others, in any place of its tile: the same bits.
  for (const auto& [first, rows] :
       {std::pair<std::int64_t, std::int64_t>{0, 1}, {5, 1}, {3, 2}, {7, 5}, {1, 22}, {22, 1}}) {
    INFO("rows " << first << " .. " << first + rows - 1);
    std::vector<float> part(static_cast<std::size_t>(rows * n));
    l3::kernels::cpu::matmul_row_invariant(
        part,
        std::span<const float>(x).subspan(static_cast<std::size_t>(first * k),
                                          static_cast<std::size_t>(rows * k)),
        w, rows, n, k, false);
    for (std::int64_t i = 0; i < rows * n; ++i) {
      REQUIRE(part[static_cast<std::size_t>(i)] == y[static_cast<std::size_t>(first * n + i)]);
    }
  }
  CHECK_THROWS(l3::kernels::cpu::matmul_row_invariant(y, x, w, m, n, k + 1, false));
}
