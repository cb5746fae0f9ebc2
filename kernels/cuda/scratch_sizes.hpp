// Sizes of the CUDA backend's temporaries, in one place for the backend and for the memory plan
// (model/memory_plan.cpp, which builds without CUDA): no CUDA headers here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/carver.hpp"

namespace l3::cuda {

// lm_head + cross-entropy: fp32 logits are built for a block of tokens at a time.
constexpr std::size_t kLogitBlockBytes = std::size_t{256} << 20U;
// Converting copies between host and device go through the scratch this many elements at a time.
constexpr std::int64_t kCopyChunkElements = std::int64_t{16} << 20U;
// The cuBLASLt workspace shared by every matmul.
constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20U;

// The embedding's gradient sums its sorted positions this many at a time (embedding.cu).
constexpr std::int64_t kEmbeddingSegment = 64;

// The embedding gradient's scratch without CUB's sort storage, carved in this order, each part
// 256-byte aligned: sorted keys and two position orders (n int32 each), then the partial sums of
// runs crossing segments (head, then tail: an fp32 row of `hidden` per segment each).
constexpr std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
constexpr std::int64_t embedding_segments(std::int64_t n) {
  return (n + kEmbeddingSegment - 1) / kEmbeddingSegment;
}
constexpr std::size_t embedding_backward_ints_bytes(std::int64_t n) {
  return align256(3 * static_cast<std::size_t>(n) * 4);
}
constexpr std::size_t embedding_backward_partial_bytes(std::int64_t n, std::int64_t hidden) {
  return align256(static_cast<std::size_t>(embedding_segments(n) * hidden) * 4);
}
constexpr std::size_t embedding_backward_own_bytes(std::int64_t n, std::int64_t hidden) {
  return embedding_backward_ints_bytes(n) + 2 * embedding_backward_partial_bytes(n, hidden);
}

// Tokens per logit block for n tokens and a vocabulary of `vocab`.
constexpr std::int64_t logit_block_rows(std::int64_t n, std::int64_t vocab) {
  return std::max<std::int64_t>(
      1, std::min<std::int64_t>(n, static_cast<std::int64_t>(kLogitBlockBytes) / (vocab * 4)));
}

// Where lm_head_cross_entropy finds its pieces in the scratch, for `counted` rows.
struct LmHeadScratch {
  std::size_t losses = 0;   // (counted) f32: each row's loss, summed at the end
  std::size_t hb = 0;       // (block, H) bf16: the block's hidden states
  std::size_t dhb = 0;      // (block, H) bf16: their gradient
  std::size_t logits = 0;   // (block, V) f32
  std::size_t dlogits = 0;  // (block, V) bf16 (backward only)
  std::int64_t block = 0;   // rows per block
};

inline LmHeadScratch carve_lm_head(Carver& carve, std::int64_t counted, std::int64_t vocab,
                                   std::int64_t hidden, bool backward) {
  LmHeadScratch s;
  s.block = logit_block_rows(counted, vocab);
  s.losses = carve.reserve<float>(counted);
  s.hb = carve.reserve<std::uint16_t>(s.block * hidden);
  s.dhb = carve.reserve<std::uint16_t>(s.block * hidden);
  s.logits = carve.reserve<float>(s.block * vocab);
  s.dlogits = carve.reserve<std::uint16_t>(backward ? s.block * vocab : 1);
  return s;
}

}  // namespace l3::cuda
