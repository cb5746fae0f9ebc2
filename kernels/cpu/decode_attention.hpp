// Generation's attention on the CPU: keys and values kept per sequence in the slots of a KV
// cache, and each new query row against the cached positions of its own sequence
// (kernels/ops.hpp, KvCacheWriteArgs and DecodeAttentionArgs). Rows are threaded over
// (row, head) and each one's scores and weighted sum are SGEMM calls laid out as the training
// attention's (kernels/cpu/attention.cpp) are for one query, with the same softmax row, so that
// a generated token sees what a training forward pass sees.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/attention.hpp"

namespace l3::kernels::cpu {

struct CacheShape {
  std::int64_t slots = 0;
  std::int64_t capacity = 0;
};

// cache[slots[i], positions[i]] = rows[i] for k and v (n, n_kv_heads, head_dim); the caches
// (slots, capacity, n_kv_heads, head_dim).
void kv_cache_write(std::span<float> k_cache, std::span<float> v_cache, std::span<const float> k,
                    std::span<const float> v, std::span<const std::int32_t> slots,
                    std::span<const std::int32_t> positions, CacheShape cache,
                    AttentionHeads heads);

// out, q (n, n_heads, head_dim): row i attends to positions 0..positions[i] of slot slots[i].
void decode_attention(std::span<float> out, std::span<const float> q,
                      std::span<const float> k_cache, std::span<const float> v_cache,
                      std::span<const std::int32_t> slots, std::span<const std::int32_t> positions,
                      CacheShape cache, AttentionHeads heads);

}  // namespace l3::kernels::cpu
