#include "kernels/cpu/gather_dot.hpp"

#include "kernels/cpu/checks.hpp"

namespace l3::kernels::cpu {

namespace {
void check_rows(std::span<const std::int32_t> rows, std::int64_t n, std::string_view kernel) {
  for (std::size_t p = 0; p < rows.size(); ++p) {
    if (rows[p] < 0 || rows[p] >= n) {
      throw core::internal_error(
          fmt::format("cpu {}: row {} of score {} outside [0, {})", kernel, rows[p], p, n));
    }
  }
}
}  // namespace

void gather_dot(std::span<float> scores, std::span<const float> h, std::span<const float> w,
                std::span<const std::int32_t> rows, std::int64_t hidden) {
  require_size(scores.size(), static_cast<std::int64_t>(rows.size()), "gather_dot", "scores");
  require_size(w.size(), hidden, "gather_dot", "w");
  check_rows(rows, static_cast<std::int64_t>(h.size()) / hidden, "gather_dot");
  for (std::size_t p = 0; p < rows.size(); ++p) {
    const float* hr = h.data() + static_cast<std::int64_t>(rows[p]) * hidden;
    float dot = 0.0F;
#pragma omp simd reduction(+ : dot)
    for (std::int64_t i = 0; i < hidden; ++i) dot += hr[i] * w[static_cast<std::size_t>(i)];
    scores[p] = dot;
  }
}

void gather_dot_backward(std::span<float> dh, std::span<float> dw, std::span<const float> dscores,
                         std::span<const float> h, std::span<const float> w,
                         std::span<const std::int32_t> rows, std::int64_t hidden) {
  require_size(dscores.size(), static_cast<std::int64_t>(rows.size()), "gather_dot_backward",
               "dscores");
  require_size(dw.size(), hidden, "gather_dot_backward", "dw");
  require_size(dh.size(), static_cast<std::int64_t>(h.size()), "gather_dot_backward", "dh");
  check_rows(rows, static_cast<std::int64_t>(h.size()) / hidden, "gather_dot_backward");
  for (std::size_t p = 0; p < rows.size(); ++p) {
    const float ds = dscores[p];
    const float* hr = h.data() + static_cast<std::int64_t>(rows[p]) * hidden;
    float* dhr = dh.data() + static_cast<std::int64_t>(rows[p]) * hidden;
#pragma omp simd
    for (std::int64_t i = 0; i < hidden; ++i) {
      dhr[i] += ds * w[static_cast<std::size_t>(i)];
      dw[static_cast<std::size_t>(i)] += ds * hr[i];
    }
  }
}

}  // namespace l3::kernels::cpu
