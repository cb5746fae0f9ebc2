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

namespace {

// One row's softmax over the group's vocabulary slices, from each rank's kVocabStats (max m,
// s = sum exp(z - m), a = sum exp(z - m)(z - m), target logit or 0), combined in rank order.
struct WholeRow {
  double lse = 0.0;
  double target_logit = 0.0;
  double entropy = 0.0;
};
WholeRow combine_slices(std::span<const double> all, std::int64_t row, std::int64_t rows,
                        int ranks) {
  const auto at = [&](int rank, int field) {
    return all[static_cast<std::size_t>((rank * rows + row) * kVocabStats + field)];
  };
  double top = at(0, 0);
  for (int r = 1; r < ranks; ++r) top = std::max(top, at(r, 0));
  double sum = 0.0;
  double weighted = 0.0;  // sum exp(z - top)(z - top)
  WholeRow whole;
  for (int r = 0; r < ranks; ++r) {
    const double shift = at(r, 0) - top;
    const double factor = std::exp(shift);
    sum += at(r, 1) * factor;
    weighted += (at(r, 2) + at(r, 1) * shift) * factor;
    whole.target_logit += at(r, 3);
  }
  whole.lse = top + std::log(sum);
  whole.entropy = std::log(sum) - weighted / sum;
  return whole;
}

}  // namespace

CrossEntropySum lm_head_cross_entropy(std::span<float> dh, std::span<float> dw,
                                      std::span<const float> h, std::span<const float> w,
                                      std::span<const std::int32_t> rows,
                                      std::span<const std::int32_t> targets, std::int64_t vocab,
                                      std::int64_t hidden, float grad_scale,
                                      CrossEntropyRows per_row, std::int64_t block_bytes,
                                      const VocabShare* vocab_share) {
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

  const bool sliced = vocab_share != nullptr && vocab_share->slice.sliced();
  const std::int64_t first_id = sliced ? vocab_share->slice.begin : 0;
  const std::int64_t whole_vocab = sliced ? vocab_share->slice.whole : vocab;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (rows[r] < 0 || rows[r] >= n) {
      throw core::internal_error(
          fmt::format("lm_head_cross_entropy: counted row {} outside [0, {})", rows[r], n));
    }
    if (targets[r] < 0 || targets[r] >= whole_vocab) {
      throw core::bad_input(
          fmt::format("target token id {} at position {} is outside the "
                      "vocabulary [0, {})",
                      targets[r], rows[r], whole_vocab));
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

  // The gradient's weight of counted row c.
  const auto row_scale = [&](std::int64_t c) {
    return per_row.scale.empty() ? grad_scale
                                 : grad_scale * per_row.scale[static_cast<std::size_t>(c)];
  };
  // Vocabulary parallelism: this slice's statistics of each row, the group's gathered and
  // combined, then the losses, entropies and gradients of the whole softmax.
  std::vector<double> mine(sliced ? static_cast<std::size_t>(block * kVocabStats) : 0U);
  std::vector<double> all(sliced ? mine.size() * static_cast<std::size_t>(vocab_share->ranks) : 0U);
  const auto slice_rows = [&](std::int64_t begin, std::int64_t count) {
    const auto owned = [&](std::int64_t r) {
      const std::int64_t id = targets[static_cast<std::size_t>(begin + r)] - first_id;
      return id >= 0 && id < vocab ? id : std::int64_t{-1};
    };
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < count; ++r) {
      float* row = logits.data() + r * vocab;
      const std::int64_t target = owned(r);
      const double target_logit = target >= 0 ? static_cast<double>(row[target]) : 0.0;
      float dot = 0.0F;
      const SoftmaxRow s = exp_row_dot(row, vocab, dot);
      double* out = mine.data() + r * kVocabStats;
      out[0] = s.max;
      out[1] = s.sum;
      out[2] = dot;
      out[3] = target_logit;
    }
    // Every rank's blocks have the same rows: `count` is the same on every rank.
    const auto used = static_cast<std::size_t>(count * kVocabStats);
    vocab_share->all_gather(std::span<const double>(mine.data(), used),
                            std::span<double>(all.data(), used * vocab_share->ranks));
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < count; ++r) {
      const WholeRow whole = combine_slices(all, r, count, vocab_share->ranks);
      row_loss[static_cast<std::size_t>(r)] = whole.lse - whole.target_logit;
      if (!per_row.entropy.empty())
        per_row.entropy[static_cast<std::size_t>(begin + r)] = static_cast<float>(whole.entropy);
      if (!backward) continue;
      // dlogits = scale * (softmax - onehot(target)) over this slice: row holds exp(z - max).
      float* row = logits.data() + r * vocab;
      const double max = mine[static_cast<std::size_t>(r * kVocabStats)];
      scale_row(row, vocab, static_cast<float>(row_scale(begin + r) * std::exp(max - whole.lse)));
      if (const std::int64_t target = owned(r); target >= 0) row[target] -= row_scale(begin + r);
    }
  };

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
    if (sliced) {
      slice_rows(begin, count);
    } else {
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
          scale_row(row, vocab, row_scale(begin + r) / s.sum);
          row[target] -= row_scale(begin + r);
        }
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
