// Ops::dropout (LoRA's): out = x * scale * keep / (1 - p) with the shared counter-based mask
// (kernels/dropout_mask.hpp). Its backward is the same op with the same seed (the mask is a
// linear map's diagonal), checked here against finite differences of the fp64 mask applied.
#include <cmath>
#include <vector>

#include "catch.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/dropout_mask.hpp"
#include "numeric_support.hpp"

using l3::kernels::ConstTensorView;
using l3::kernels::TensorView;

namespace {

std::vector<float> dropped(l3::kernels::Ops& ops, const std::vector<float>& x, float p, float scale,
                           std::uint64_t seed) {
  std::vector<float> out(x.size());
  ops.dropout({.out = TensorView(std::span<float>(out)),
               .x = ConstTensorView(std::span<const float>(x)),
               .p = p,
               .scale = scale,
               .seed = seed});
  return out;
}

}  // namespace

TEST_CASE("dropout keeps 1 - p of the elements, scaled by 1 / (1 - p), the same for a seed",
          "[kernels][dropout]") {
  INFO("seed " << l3::test::test_seed());
  l3::kernels::CpuOps ops;
  const std::size_t n = 100000;
  l3::test::Random rnd(30);
  const std::vector<float> x = rnd.normal(n);
  const float p = 0.3F;
  const auto out = dropped(ops, x, p, 2.0F, 7);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (out[i] == 0.0F) continue;
    ++kept;
    REQUIRE(out[i] == x[i] * (2.0F / (1.0F - p)));
    // the shared mask function, element by element
    REQUIRE(l3::kernels::dropout_keep(7, i, l3::kernels::dropout_threshold(p)));
  }
  // Binomial(1e5, 0.7): standard deviation 145; 5 of them
  CHECK(std::abs(static_cast<double>(kept) - 0.7 * n) < 725.0);
  CHECK(dropped(ops, x, p, 2.0F, 7) == out);
  CHECK(dropped(ops, x, p, 2.0F, 8) != out);
  // p = 0: a plain scale; in place gives the same as out of place
  const auto scaled = dropped(ops, x, 0.0F, 0.5F, 7);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(scaled[i] == x[i] * 0.5F);
  std::vector<float> in_place = x;
  ops.dropout({.out = TensorView(std::span<float>(in_place)),
               .x = ConstTensorView(std::span<const float>(in_place)),
               .p = p,
               .scale = 2.0F,
               .seed = 7});
  CHECK(in_place == out);
}

TEST_CASE("dropout's backward is itself with the same seed (finite differences)",
          "[kernels][dropout]") {
  INFO("seed " << l3::test::test_seed());
  l3::kernels::CpuOps ops;
  const std::size_t n = 64;
  l3::test::Random rnd(31);
  const std::vector<float> x = rnd.normal(n);
  const std::vector<float> dout = rnd.normal(n);
  const float p = 0.25F;
  const float scale = 1.5F;
  const std::uint32_t threshold = l3::kernels::dropout_threshold(p);
  const auto forward = [&](const std::vector<double>& v) {
    std::vector<double> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      out[i] = l3::kernels::dropout_keep(3, i, threshold) ? v[i] * scale / (1.0 - p) : 0.0;
    }
    return out;
  };
  CHECK(l3::test::rel_error(dropped(ops, x, p, scale, 3), forward(l3::test::to_double(x))) < 1e-6);
  const auto fd = l3::test::finite_differences(
      [&](const std::vector<double>& v) { return l3::test::weighted_sum(forward(v), dout); },
      l3::test::to_double(x));
  CHECK(l3::test::rel_error(dropped(ops, dout, p, scale, 3), fd) < 1e-6);
}

TEST_CASE("dropout refuses p of 1 or more, and mismatched shapes", "[kernels][dropout]") {
  l3::kernels::CpuOps ops;
  std::vector<float> x(8);
  std::vector<float> y(7);
  const TensorView out(std::span<float>(x.data(), x.size()));
  CHECK_THROWS_WITH(ops.dropout({.out = out, .x = out, .p = 1.0F}), Catch::Contains("p = 1"));
  CHECK_THROWS_WITH(ops.dropout({.out = TensorView(std::span<float>(y)), .x = out}),
                    Catch::Contains("dropout: 'out'"));
}
