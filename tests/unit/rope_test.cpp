#include "kernels/cpu/rope.hpp"

#include <cmath>

#include "catch.hpp"
#include "model/rope_table.hpp"
#include "numeric_support.hpp"
#include "reference_ops.hpp"

namespace ref = l3::test::reference;
using l3::test::rel_error;

namespace {
l3::model::ModelConfig rope_config(bool scaled) {
  l3::model::ModelConfig c = l3::model::preset("tiny");
  c.head_dim = 16;
  if (scaled) c.rope_scaling = {true, 8.0, 1.0, 4.0, 8192};
  return c;
}
}  // namespace

TEST_CASE("llama3 RoPE scaling matches the frequencies worked out by hand", "[rope]") {
  l3::model::ModelConfig c = l3::model::preset("llama3.1-8b");  // head_dim 128, theta 5e5, factor 8
  const std::vector<float> f = l3::model::rope_inverse_frequencies(c);
  REQUIRE(f.size() == 64);
  // i = 0: wavelength 2 pi < 8192/4 (high-frequency band): unchanged
  CHECK(f[0] == Approx(1.0).epsilon(1e-7));
  // i = 63: 500000^(-126/128) = 2.45514e-6, wavelength 2.56e6 > 8192: divided by 8
  CHECK(f[63] == Approx(2.455140791131609e-06 / 8).epsilon(1e-5));
  // i = 32: 1/sqrt(500000), wavelength 4442.9 between 2048 and 8192: smooth = (8192/4442.88 - 1)/3
  //   = 0.281284, f = (1 - smooth) f0/8 + smooth f0 = 5.248462e-4
  CHECK(f[32] == Approx(5.248461609929547e-4).epsilon(1e-5));
  CHECK(f[30] == Approx(1.3718935677611381e-3).epsilon(1e-5));

  l3::model::ModelConfig c32 = l3::model::preset("llama3.2-1b");  // factor 32, head_dim 64
  const std::vector<float> f32 = l3::model::rope_inverse_frequencies(c32);
  // i = 16 of 32 is 500000^(-1/2) again: (1 - smooth) f0/32 + smooth f0
  CHECK(f32[16] == Approx(4.2955679655936815e-4).epsilon(1e-5));

  // Without scaling: plain 1 / theta^(2i/d)
  c.rope_scaling.enabled = false;
  const std::vector<float> plain = l3::model::rope_inverse_frequencies(c);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CHECK(plain[i] ==
          Approx(std::pow(500000.0, -2.0 * static_cast<double>(i) / 128.0)).epsilon(1e-6));
  }
}

TEST_CASE("rope forward matches fp64 rotation, backward is its transpose", "[kernels][rope]") {
  INFO("seed " << l3::test::test_seed());
  for (const bool scaled : {false, true}) {
    const l3::model::ModelConfig c = rope_config(scaled);
    const int heads = 3;
    const int hd = c.head_dim;
    const std::vector<std::int32_t> positions = {0, 1, 2, 0, 1, 5, 6, 7, 40, 41};
    const auto table = l3::model::make_rope_table(c, 64);
    const auto inv_freq = l3::model::rope_inverse_frequencies(c);
    l3::test::Random rnd(7);
    const auto x = rnd.uniform(positions.size() * heads * hd);

    auto y = x;
    l3::kernels::cpu::rope(y, positions, table.cos, table.sin, heads, hd);
    const auto expected = ref::rope(l3::test::to_double(x), positions, inv_freq, heads, hd);
    CHECK(rel_error(y, expected) < 1e-6);

    const auto dout = rnd.uniform(x.size());
    auto dx = dout;
    l3::kernels::cpu::rope_backward(dx, positions, table.cos, table.sin, heads, hd);
    const auto fd = l3::test::finite_differences(
        [&](const std::vector<double>& xv) {
          return l3::test::weighted_sum(ref::rope(xv, positions, inv_freq, heads, hd), dout);
        },
        l3::test::to_double(x));
    CHECK(rel_error(dx, fd) < 1e-4);
  }
}

TEST_CASE("the table starts at the identity and rejects positions beyond it", "[kernels][rope]") {
  const l3::model::ModelConfig c = rope_config(false);
  const auto table = l3::model::make_rope_table(c, 4);
  for (int i = 0; i < table.half; ++i) {
    CHECK(table.cos[static_cast<std::size_t>(i)] == 1.0F);
    CHECK(table.sin[static_cast<std::size_t>(i)] == 0.0F);
  }
  std::vector<float> x(static_cast<std::size_t>(c.head_dim), 1.0F);
  const std::vector<std::int32_t> beyond = {4};
  CHECK_THROWS(l3::kernels::cpu::rope(x, beyond, table.cos, table.sin, 1, c.head_dim));
}
