#include "kernels/cpu/embedding.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/parallel.hpp"

namespace l3::kernels::cpu {

namespace {
void check_tokens(std::span<const std::int32_t> tokens, std::int64_t vocab,
                  std::string_view kernel) {
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= vocab) {
      throw core::bad_input(
          fmt::format("token id {} at position {} is outside the vocabulary "
                      "[0, {}) ({})",
                      tokens[t], t, vocab, kernel));
    }
  }
}
}  // namespace

void embedding(std::span<float> out, std::span<const std::int32_t> tokens,
               std::span<const float> table, std::int64_t hidden, TableRows ids) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  require_size(out.size(), n * hidden, "embedding", "out");
  const std::int64_t rows = hidden == 0 ? 0 : static_cast<std::int64_t>(table.size()) / hidden;
  check_tokens(tokens, ids.whole > 0 ? ids.whole : rows, "embedding");
  const auto h = static_cast<std::size_t>(hidden);
#pragma omp parallel for schedule(static)
  for (std::int64_t t = 0; t < n; ++t) {
    float* dst = out.data() + static_cast<std::size_t>(t) * h;
    const std::int64_t row = tokens[static_cast<std::size_t>(t)] - ids.begin;
    if (row < 0 || row >= rows) {
      std::fill_n(dst, h, 0.0F);  // another rank's id (vocabulary parallelism)
      continue;
    }
    std::memcpy(dst, table.data() + static_cast<std::size_t>(row) * h, h * sizeof(float));
  }
}

void embedding_backward(std::span<float> dtable, std::span<const std::int32_t> tokens,
                        std::span<const float> dout, std::int64_t hidden, TableRows ids) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  require_size(dout.size(), n * hidden, "embedding_backward", "dout");
  const std::int64_t rows = hidden == 0 ? 0 : static_cast<std::int64_t>(dtable.size()) / hidden;
  check_tokens(tokens, ids.whole > 0 ? ids.whole : rows, "embedding_backward");
#pragma omp parallel
  {
    const Range cols = static_share(hidden, omp_get_thread_num(), omp_get_num_threads());
    for (std::int64_t t = 0; t < n; ++t) {
      const std::int64_t row = tokens[static_cast<std::size_t>(t)] - ids.begin;
      if (row < 0 || row >= rows) continue;  // another rank's id
      float* dst = dtable.data() + static_cast<std::size_t>(row) * static_cast<std::size_t>(hidden);
      const float* src = dout.data() + static_cast<std::size_t>(t * hidden);
#pragma omp simd
      for (std::int64_t c = cols.begin; c < cols.end; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace l3::kernels::cpu
