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

TEST_CASE(
    "a vocabulary slice of the embedding gives its own rows and zeros elsewhere in both passes",
    "[kernels][embedding][tensor]") {
  const std::int64_t vocab = 12;
  const std::int64_t hidden = 5;
  l3::test::Random rnd(4);
  const auto table = rnd.uniform(vocab * hidden);
  const std::vector<std::int32_t> tokens = {3, 0, 11, 7, 3, 4};
  const auto dout = rnd.uniform(tokens.size() * hidden);
  std::vector<float> whole_out(tokens.size() * hidden);
  std::vector<float> whole_dtable(vocab * hidden, 0.0F);
  l3::kernels::cpu::embedding(whole_out, tokens, table, hidden);
  l3::kernels::cpu::embedding_backward(whole_dtable, tokens, dout, hidden);

  const std::int64_t rows = vocab / 3;  // 3 slices of 4 ids
  std::vector<float> sum(whole_out.size(), 0.0F);
  for (std::int64_t begin = 0; begin < vocab; begin += rows) {
    const std::span<const float> mine(table.data() + begin * hidden,
                                      static_cast<std::size_t>(rows * hidden));
    const l3::kernels::cpu::TableRows ids{.begin = begin, .whole = vocab};
    std::vector<float> out(whole_out.size(), -1.0F);
    l3::kernels::cpu::embedding(out, tokens, mine, hidden, ids);
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      const bool owned = tokens[t] >= begin && tokens[t] < begin + rows;
      for (std::int64_t i = 0; i < hidden; ++i) {
        CHECK(out[t * hidden + i] == (owned ? whole_out[t * hidden + i] : 0.0F));
        sum[t * hidden + i] += out[t * hidden + i];
      }
    }
    std::vector<float> dtable(rows * hidden, 0.0F);
    l3::kernels::cpu::embedding_backward(dtable, tokens, dout, hidden, ids);
    for (std::int64_t i = 0; i < rows * hidden; ++i)
      CHECK(dtable[i] == whole_dtable[begin * hidden + i]);
  }
  CHECK(sum == whole_out);
  // An id outside the whole vocabulary is refused, not taken for another rank's.
  const std::vector<std::int32_t> bad = {1, 12};
  std::vector<float> small(bad.size() * hidden);
  CHECK_THROWS_AS(l3::kernels::cpu::embedding(small, bad, std::span<const float>(table).first(20),
                                              hidden, {.begin = 4, .whole = vocab}),
                  l3::core::Error);
}
