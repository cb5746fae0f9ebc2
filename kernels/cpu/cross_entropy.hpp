// The lm_head and the masked cross-entropy, fused: logits are computed for a block of counted
// tokens at a time (never for the whole batch), turned into the loss and, in the same pass,
// into the gradients of the hidden states and of the lm_head weights. Only the counted rows cost
// anything (SFT does not count the prompt).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/ops.hpp"

namespace l3::kernels::cpu {

struct CrossEntropySum {
  double loss = 0.0;        // sum over counted tokens of logsumexp(logits) - logits[target]
  std::int64_t tokens = 0;  // counted tokens
};

// Memory for logits of one block: about this many bytes (at least one token).
inline constexpr std::int64_t kLogitBlockBytes = 64LL << 20U;

// h (N, H); w (V, H); rows (C): the counted positions, in the order their losses are summed;
// targets (C): the token each predicts. With dh non-empty: dh (N, H) = grad_scale * d(loss)/dh
// (rows not counted are 0) and dw (V, H) += grad_scale * d(loss)/dw (skipped when dw is empty).
// row_loss (C), when non-empty, receives each counted row's loss; row_scale (C), when non-empty,
// weighs each row's gradient (grad_scale * row_scale[c]); entropy (C), when non-empty, receives
// each counted row's entropy of softmax(logits) in nats (no gradient). The logits are
// logit_scale * h w^T (kernels::logit_scale(T): divided by a sampling temperature), and the
// gradients those of the scaled logits. With `vocab` (vocabulary parallelism, as
// LmHeadCrossEntropyArgs::vocab): w holds the slice's rows, targets are whole ids, the losses and
// entropies are the whole vocabulary's, dw the slice's and dh the slice's part.
struct CrossEntropyRows {
  std::span<float> loss{};
  std::span<const float> scale{};
  std::span<float> entropy{};
  float logit_scale = 1.0F;
};
CrossEntropySum lm_head_cross_entropy(
    std::span<float> dh, std::span<float> dw, std::span<const float> h, std::span<const float> w,
    std::span<const std::int32_t> rows, std::span<const std::int32_t> targets, std::int64_t vocab,
    std::int64_t hidden, float grad_scale, CrossEntropyRows per_row = {},
    std::int64_t block_bytes = kLogitBlockBytes, const VocabShare* vocab_share = nullptr);

}  // namespace l3::kernels::cpu
