// Sizes of the CUDA backend's temporaries, in one place for the backend and for the memory plan
// (model/memory_plan.cpp, which builds without CUDA): no CUDA headers here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace l3::cuda {

// lm_head + cross-entropy: fp32 logits are built for a block of tokens at a time.
constexpr std::size_t kLogitBlockBytes = std::size_t{256} << 20U;
// Converting copies between host and device go through the scratch this many elements at a time.
constexpr std::int64_t kCopyChunkElements = std::int64_t{16} << 20U;
// The cuBLASLt workspace shared by every matmul.
constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20U;

// Tokens per logit block for n tokens and a vocabulary of `vocab`.
constexpr std::int64_t logit_block_rows(std::int64_t n, std::int64_t vocab) {
  return std::max<std::int64_t>(
      1, std::min<std::int64_t>(n, static_cast<std::int64_t>(kLogitBlockBytes) / (vocab * 4)));
}

}  // namespace l3::cuda
