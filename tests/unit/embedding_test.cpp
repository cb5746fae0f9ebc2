#include "kernels/cpu/embedding.hpp"

#include "catch.hpp"
#include "core/error.hpp"
#include "numeric_support.hpp"

TEST_CASE("embedding looks rows up and scatters gradients back, repeats included",
          "[kernels][embedding]") {
  INFO("seed " << l3::test::test_seed());
  const std::int64_t vocab = 11;
  const std::int64_t hidden = 6;
  l3::test::Random rnd(3);
  const auto table = rnd.uniform(vocab * hidden);
  const std::vector<std::int32_t> tokens = {3, 0, 3, 10, 7, 3};
  std::vector<float> out(tokens.size() * hidden);
  l3::kernels::cpu::embedding(out, tokens, table, hidden);
  for (std::size_t t = 0; t < tokens.size(); ++t)
    for (std::int64_t i = 0; i < hidden; ++i)
      CHECK(out[t * hidden + i] == table[tokens[t] * hidden + i]);

  // The gradient of sum(dout * out) w.r.t. table row r is the sum of dout over tokens == r.
  const auto dout = rnd.uniform(out.size());
  std::vector<float> dtable(vocab * hidden, 0.0F);
  l3::kernels::cpu::embedding_backward(dtable, tokens, dout, hidden);
  std::vector<double> expected(dtable.size(), 0.0);
  for (std::size_t t = 0; t < tokens.size(); ++t)
    for (std::int64_t i = 0; i < hidden; ++i)
      expected[tokens[t] * hidden + i] += dout[t * hidden + i];
  CHECK(l3::test::rel_error(dtable, expected) < 1e-6);

  const std::vector<std::int32_t> bad = {1, 11};
  std::vector<float> small(bad.size() * hidden);
  CHECK_THROWS_AS(l3::kernels::cpu::embedding(small, bad, table, hidden), l3::core::Error);
}
