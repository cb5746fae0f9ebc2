// Sizes of cuDNN attention's own device buffer (cudnn_attention.cpp), in one place for the
// component and for the memory plan (model/memory_plan.cpp, which builds without CUDA): no CUDA
// headers here.
//
// The buffer of one CudnnAttention holds, for its largest call, the per-segment tables, our fp32
// scratch and cuDNN's plan workspace. The backward's is the larger: (N + margin) x heads fp32
// statistics and row sums, the fp32 dQ accumulator (N + margin, heads, head_dim) unless
// deterministic, per-query-head dK and dV (sized as fp32) for GQA, then cuDNN's workspace.
// cuDNN's workspace is only known once a plan is built on the GPU: the non-deterministic
// backward's is small (its accumulator is ours); the deterministic one keeps dP in it, about
// 2 * B * heads * S^2 bytes for the bucket B x S (cudnn-frontend sizes its dP-workspace path the
// same way), and a plan above kCudnnMaxPlanWorkspaceBytes is refused (that call runs on the
// fallback attention).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/carver.hpp"

namespace l3::cuda {

constexpr std::int64_t kCudnnMinSeqBucket = 128;  // smallest S of a plan (one cuDNN tile)
constexpr std::int64_t kCudnnTokenMargin = 128;   // spare tokens at the end of our fp32 scratch
// Plans whose cuDNN workspace exceeds this are refused (CudnnAttentionOptions' default).
constexpr std::size_t kCudnnMaxPlanWorkspaceBytes = std::size_t{4} << 30U;
constexpr int kCudnnMaxHeadDim = 128;  // what the tests cover (64 and 128)

// Whether cuDNN attention takes a model's heads at all (else every call runs on the fallback):
// n_heads a multiple of n_kv_heads, head_dim a multiple of 16 and at most kCudnnMaxHeadDim.
constexpr bool cudnn_attention_takes_heads(std::int64_t heads, std::int64_t kv_heads,
                                           std::int64_t head_dim) {
  return heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && head_dim % 16 == 0 &&
         head_dim <= kCudnnMaxHeadDim;
}

// B and S of a plan: segments and the longest segment, rounded up to powers of two.
constexpr std::int64_t cudnn_bucket(std::int64_t n, std::int64_t minimum) {
  return std::max(minimum, static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(n))));
}

// Where the backward finds its pieces in the buffer (offsets), carved in this order.
struct CudnnBackwardScratch {
  std::size_t seq_len = 0;       // (batch) i32
  std::size_t offset_q = 0;      // (batch + 1) i64
  std::size_t offset_kv = 0;     // (batch + 1) i64
  std::size_t offset_stats = 0;  // (batch + 1) i64
  std::size_t stats = 0;         // (N + margin, heads) f32
  std::size_t dot = 0;           // (N + margin, heads) f32
  std::size_t accum = 0;         // (N + margin, heads, head_dim) f32, non-deterministic only
  std::size_t accum_bytes = 0;
  std::size_t dk_full = 0;  // (N + margin, heads, head_dim) as f32, GQA only
  std::size_t dv_full = 0;
  std::size_t full_bytes = 0;
};

// The segment tables of a plan with `batch` batches (forward and backward).
struct CudnnTablesAt {
  std::size_t seq_len = 0;
  std::size_t offset_q = 0;
  std::size_t offset_kv = 0;
  std::size_t offset_stats = 0;
};
inline CudnnTablesAt carve_cudnn_tables(Carver& carve, std::int64_t batch) {
  const auto entries = static_cast<std::size_t>(batch);
  CudnnTablesAt where;
  where.seq_len = carve.reserve_bytes(entries * sizeof(std::int32_t));
  where.offset_q = carve.reserve_bytes((entries + 1) * sizeof(std::int64_t));
  where.offset_kv = carve.reserve_bytes((entries + 1) * sizeof(std::int64_t));
  where.offset_stats = carve.reserve_bytes((entries + 1) * sizeof(std::int64_t));
  return where;
}

// Our part of the backward's buffer for n tokens (cuDNN's workspace is reserved after it).
inline CudnnBackwardScratch carve_cudnn_backward(Carver& carve, std::int64_t n, std::int64_t heads,
                                                 std::int64_t kv_heads, std::int64_t head_dim,
                                                 std::int64_t batch, bool deterministic) {
  const auto rows = static_cast<std::size_t>((n + kCudnnTokenMargin) * heads);
  CudnnBackwardScratch s;
  const CudnnTablesAt tables = carve_cudnn_tables(carve, batch);
  s.seq_len = tables.seq_len;
  s.offset_q = tables.offset_q;
  s.offset_kv = tables.offset_kv;
  s.offset_stats = tables.offset_stats;
  s.stats = carve.reserve_bytes(rows * sizeof(float));
  s.dot = carve.reserve_bytes(rows * sizeof(float));
  s.accum_bytes = deterministic ? 0 : rows * static_cast<std::size_t>(head_dim) * sizeof(float);
  s.accum = carve.reserve_bytes(s.accum_bytes);
  // GQA per-query-head dK, dV: bf16 in the graph, sized for fp32 as cudnn-frontend does
  s.full_bytes = heads != kv_heads ? rows * static_cast<std::size_t>(head_dim) * sizeof(float) : 0;
  s.dk_full = carve.reserve_bytes(s.full_bytes);
  s.dv_full = carve.reserve_bytes(s.full_bytes);
  return s;
}

// The deterministic backward's cuDNN workspace for a bucket, by the dP estimate above (the
// measured figure is the GPU check's: l3-bench-gpu --attention-variants).
constexpr std::int64_t cudnn_deterministic_workspace_estimate(std::int64_t batch_bucket,
                                                              std::int64_t seq_bucket,
                                                              std::int64_t heads) {
  return 2 * batch_bucket * heads * seq_bucket * seq_bucket;
}

}  // namespace l3::cuda
