#include "kernels/cpu/cross_entropy.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/vector_math.hpp"

namespace l3::kernels::cpu {

CrossEntropySum lm_head_cross_entropy(std::span<float> dh, std::span<float> dw,
                                      std::span<const float> h, std::span<const float> w,
                                      std::span<const std::int32_t> rows,
                                      std::span<const std::int32_t> targets, std::int64_t vocab,
                                      std::int64_t hidden, float grad_scale,
                                      CrossEntropyRows per_row, std::int64_t block_bytes) {
  const auto n = static_cast<std::int64_t>(h.size()) / std::max<std::int64_t>(hidden, 1);
  const bool backward = !dh.empty();
  require_size(h.size(), n * hidden, "lm_head_cross_entropy", "h");
  require_size(w.size(), vocab * hidden, "lm_head_cross_entropy", "w");
  require_size(targets.size(), static_cast<std::int64_t>(rows.size()), "lm_head_cross_entropy",
               "targets");
  const auto counted = static_cast<std::int64_t>(rows.size());
  if (!per_row.loss.empty())
    require_size(per_row.loss.size(), counted, "lm_head_cross_entropy", "row_loss");
  if (!per_row.scale.empty())
    require_size(per_row.scale.size(), counted, "lm_head_cross_entropy", "row_scale");
  if (!per_row.entropy.empty())
    require_size(per_row.entropy.size(), counted, "lm_head_cross_entropy", "row_entropy");
  if (backward) {
    require_size(dh.size(), n * hidden, "lm_head_cross_entropy", "dh");
    if (!dw.empty()) require_size(dw.size(), vocab * hidden, "lm_head_cross_entropy", "dw");
    std::fill(dh.begin(), dh.end(), 0.0F);
  }

  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (rows[r] < 0 || rows[r] >= n) {
      throw core::internal_error(
          fmt::format("lm_head_cross_entropy: counted row {} outside [0, {})", rows[r], n));
    }
    if (targets[r] < 0 || targets[r] >= vocab) {
      throw core::bad_input(
          fmt::format("target token id {} at position {} is outside the "
                      "vocabulary [0, {})",
                      targets[r], rows[r], vocab));
    }
  }
  CrossEntropySum result;
  result.tokens = static_cast<std::int64_t>(rows.size());
  if (rows.empty()) return result;

  const std::int64_t block = std::clamp<std::int64_t>(
      block_bytes / (vocab * static_cast<std::int64_t>(sizeof(float))), 1, result.tokens);
  std::vector<float> hb(static_cast<std::size_t>(block * hidden));
  std::vector<float> logits(static_cast<std::size_t>(block * vocab));
  std::vector<float> dhb(backward ? hb.size() : 0U);
  std::vector<double> row_loss(static_cast<std::size_t>(block));
  const int iv = blas_int(vocab, "lm_head_cross_entropy");
  const int ih = blas_int(hidden, "lm_head_cross_entropy");

  for (std::int64_t begin = 0; begin < result.tokens; begin += block) {
    const std::int64_t count = std::min(block, result.tokens - begin);
    const int ir = static_cast<int>(count);
    for (std::int64_t r = 0; r < count; ++r) {
      std::memcpy(
          hb.data() + r * hidden,
          h.data() + static_cast<std::int64_t>(rows[static_cast<std::size_t>(begin + r)]) * hidden,
          static_cast<std::size_t>(hidden) * sizeof(float));
    }
    // logits (count, V) = logit_scale * hb (count, H) . w^T (H, V)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ir, iv, ih, per_row.logit_scale, hb.data(),
                ih, w.data(), ih, 0.0F, logits.data(), iv);
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < count; ++r) {
      float* row = logits.data() + r * vocab;
      const std::int32_t target = targets[static_cast<std::size_t>(begin + r)];
      const float target_logit = row[target];
      // row = exp(logits - max)
      const SoftmaxRow s =
          per_row.entropy.empty()
              ? exp_row(row, vocab)
              : exp_row_entropy(row, vocab, per_row.entropy[static_cast<std::size_t>(begin + r)]);
      const double lse = static_cast<double>(s.max) + std::log(static_cast<double>(s.sum));
      row_loss[static_cast<std::size_t>(r)] = lse - static_cast<double>(target_logit);
      if (backward) {
        // dlogits = scale * (softmax - onehot(target)), in place
        const float scale = per_row.scale.empty()
                                ? grad_scale
                                : grad_scale * per_row.scale[static_cast<std::size_t>(begin + r)];
        scale_row(row, vocab, scale / s.sum);
        row[target] -= scale;
      }
    }
    for (std::int64_t r = 0; r < count; ++r) {
      result.loss += row_loss[static_cast<std::size_t>(r)];
      if (!per_row.loss.empty()) {
        per_row.loss[static_cast<std::size_t>(begin + r)] =
            static_cast<float>(row_loss[static_cast<std::size_t>(r)]);
      }
    }
    if (!backward) continue;
    // dhb (count, H) = logit_scale * dlogits (count, V) . w (V, H)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ir, ih, iv, per_row.logit_scale,
                logits.data(), iv, w.data(), ih, 0.0F, dhb.data(), ih);
    for (std::int64_t r = 0; r < count; ++r) {
      std::memcpy(
          dh.data() + static_cast<std::int64_t>(rows[static_cast<std::size_t>(begin + r)]) * hidden,
          dhb.data() + r * hidden, static_cast<std::size_t>(hidden) * sizeof(float));
    }
    if (dw.empty()) continue;  // a frozen lm_head (LoRA)
    // dw (V, H) += logit_scale * dlogits^T (V, count) . hb (count, H)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, iv, ih, ir, per_row.logit_scale,
                logits.data(), iv, hb.data(), ih, 1.0F, dw.data(), ih);
  }
  return result;
}

}  // namespace l3::kernels::cpu
