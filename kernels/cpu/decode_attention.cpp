#include "kernels/cpu/decode_attention.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/vector_math.hpp"

namespace l3::kernels::cpu {

namespace {

// Row i's place in the cache, checked: a wrong slot or position would read or write another
// sequence's memory.
std::int64_t cache_row(std::span<const std::int32_t> slots, std::span<const std::int32_t> positions,
                       std::size_t i, CacheShape cache, std::string_view kernel) {
  const std::int64_t slot = slots[i];
  const std::int64_t position = positions[i];
  if (slot < 0 || slot >= cache.slots || position < 0 || position >= cache.capacity) {
    throw core::internal_error(
        fmt::format("cpu {}: row {} at slot {} position {} outside a cache "
                    "of {} slots of {} positions",
                    kernel, i, slot, position, cache.slots, cache.capacity));
  }
  return slot * cache.capacity + position;
}

}  // namespace

void kv_cache_write(std::span<float> k_cache, std::span<float> v_cache, std::span<const float> k,
                    std::span<const float> v, std::span<const std::int32_t> slots,
                    std::span<const std::int32_t> positions, CacheShape cache,
                    AttentionHeads heads) {
  const std::int64_t row = std::int64_t{heads.n_kv_heads} * heads.head_dim;
  const auto n = static_cast<std::int64_t>(slots.size());
  require_size(k.size(), n * row, "kv_cache_write", "k");
  require_size(v.size(), n * row, "kv_cache_write", "v");
  require_size(k_cache.size(), cache.slots * cache.capacity * row, "kv_cache_write", "k_cache");
  require_size(v_cache.size(), cache.slots * cache.capacity * row, "kv_cache_write", "v_cache");
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::int64_t at = cache_row(slots, positions, i, cache, "kv_cache_write") * row;
    const auto from = static_cast<std::int64_t>(i) * row;
    std::copy_n(k.begin() + from, row, k_cache.begin() + at);
    std::copy_n(v.begin() + from, row, v_cache.begin() + at);
  }
}

void decode_attention(std::span<float> out, std::span<const float> q,
                      std::span<const float> k_cache, std::span<const float> v_cache,
                      std::span<const std::int32_t> slots, std::span<const std::int32_t> positions,
                      CacheShape cache, AttentionHeads heads) {
  const std::int64_t hd = heads.head_dim;
  const std::int64_t q_stride = std::int64_t{heads.n_heads} * hd;
  const std::int64_t kv_stride = std::int64_t{heads.n_kv_heads} * hd;
  const auto n = static_cast<std::int64_t>(slots.size());
  require_size(q.size(), n * q_stride, "decode_attention", "q");
  require_size(out.size(), n * q_stride, "decode_attention", "out");
  require_size(k_cache.size(), cache.slots * cache.capacity * kv_stride, "decode_attention",
               "k_cache");
  require_size(v_cache.size(), cache.slots * cache.capacity * kv_stride, "decode_attention",
               "v_cache");
  std::vector<std::int64_t> first(static_cast<std::size_t>(n));  // row i's slot's position 0
  std::int64_t longest = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::int64_t at = cache_row(slots, positions, i, cache, "decode_attention");
    first[i] = at - positions[i];
    longest = std::max<std::int64_t>(longest, positions[i] + 1);
  }
  const int group = heads.n_heads / heads.n_kv_heads;
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const std::int64_t items = n * heads.n_heads;

#pragma omp parallel
  {
    std::vector<float> scores(static_cast<std::size_t>(longest));
#pragma omp for schedule(dynamic)
    for (std::int64_t item = 0; item < items; ++item) {
      const std::int64_t i = item / heads.n_heads;
      const std::int64_t head = item % heads.n_heads;
      const std::int64_t keys = positions[static_cast<std::size_t>(i)] + 1;
      const std::int64_t kv_head = head / group;
      const float* query = q.data() + i * q_stride + head * hd;
      const float* k_seq =
          k_cache.data() + first[static_cast<std::size_t>(i)] * kv_stride + kv_head * hd;
      const float* v_seq =
          v_cache.data() + first[static_cast<std::size_t>(i)] * kv_stride + kv_head * hd;
      // scores (1, keys) = scale * query (1, hd) . k_seq^T (hd, keys): the training kernel's
      // call for a tile of one query
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, static_cast<int>(keys),
                  static_cast<int>(hd), scale, query, static_cast<int>(q_stride), k_seq,
                  static_cast<int>(kv_stride), 0.0F, scores.data(), static_cast<int>(keys));
      const SoftmaxRow s = exp_row(scores.data(), keys);
      scale_row(scores.data(), keys, 1.0F / s.sum);
      // out (1, hd) = probabilities (1, keys) . v_seq (keys, hd)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, static_cast<int>(hd),
                  static_cast<int>(keys), 1.0F, scores.data(), static_cast<int>(keys), v_seq,
                  static_cast<int>(kv_stride), 0.0F, out.data() + i * q_stride + head * hd,
                  static_cast<int>(q_stride));
    }
  }
}

}  // namespace l3::kernels::cpu
