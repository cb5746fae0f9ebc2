// Generation's attention: rows written into the slots of a KV cache (kv_cache_write) and each
// query row against the cached positions of its own sequence (decode_attention), flash-decoding
// style. One block per (row, KV head, split of the keys) serves the `group` query heads that
// share the KV head (GQA by indexing: K and V are read once per group, never replicated). The
// block walks its keys in tiles through shared memory with an online softmax in fp32: per head a
// running max m and sum l of exp(s - m), and an fp32 accumulator rescaled by exp(m_old - m_new)
// at each tile. A long cache is split over several blocks (the keys of one row cut into
// `splits` ranges) whose partial (m, l, accumulator) a second kernel merges, so that a batch of
// a few rows still fills the GPU. Slots and positions are read on the device: a row's length is
// never needed on the host.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/scratch_sizes.hpp"

namespace l3::cuda {

namespace {

constexpr int kThreads = 128;  // decode blocks: 4 warps
constexpr int kMaxTile = 32;   // keys per tile (fewer when shared memory is short)
constexpr int kCopyThreads = 256;
// Splitting: enough blocks to occupy a GPU (about two per SM of an H100/H200), never splits of
// fewer than kMinSplitKeys keys (the merge would cost more than it saves), at most kMaxSplits.
constexpr std::int64_t kTargetBlocks = 256;
constexpr std::int64_t kMinSplitKeys = 128;
constexpr std::int64_t kMaxSplits = 64;
// Static plus dynamic shared memory without an opt-in is 48 KiB.
constexpr std::size_t kMaxSharedBytes = 48 * 1024;

// Row i's cache row of key t, or -1 when its slot or position lies outside the cache (nothing is
// then read or written for it: the CPU backend throws instead).
__device__ __forceinline__ std::int64_t cache_base(const std::int32_t* slots,
                                                   const std::int32_t* positions, std::int64_t i,
                                                   const CacheGeometry& g) {
  const std::int64_t slot = slots[i];
  const std::int64_t position = positions[i];
  if (slot < 0 || slot >= g.slots || position < 0 || position >= g.capacity) return -1;
  return slot * g.capacity;  // position 0 of the slot, in rows of n_kv_heads * head_dim
}

// One thread per element (or per 8 elements, `wide`: head_dim % 8 == 0 and every base 16-byte
// aligned) of k and v (rows, n_kv_heads * head_dim).
__global__ void kv_cache_write_kernel(bf16* k_cache, bf16* v_cache, const bf16* k, const bf16* v,
                                      const std::int32_t* slots, const std::int32_t* positions,
                                      CacheGeometry g, std::int64_t per_row, bool wide) {
  const std::int64_t id = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const int width = wide ? 8 : 1;
  const std::int64_t units = per_row / width;
  if (id >= g.rows * units) return;
  const std::int64_t i = id / units;
  const std::int64_t at = (id % units) * width;
  const std::int64_t slot_row = cache_base(slots, positions, i, g);
  if (slot_row < 0) return;
  const std::int64_t dst = (slot_row + positions[i]) * per_row + at;
  const std::int64_t src = i * per_row + at;
  if (wide) {
    *reinterpret_cast<Bf16x8*>(k_cache + dst) = *reinterpret_cast<const Bf16x8*>(k + src);
    *reinterpret_cast<Bf16x8*>(v_cache + dst) = *reinterpret_cast<const Bf16x8*>(v + src);
  } else {
    k_cache[dst] = k[src];
    v_cache[dst] = v[src];
  }
}

// The dynamic shared memory of a decode block, in floats:
//   q (group, D) | k^T (D, tile + 1) | v (tile, D) | p (group, tile) | acc (group, D) | m, l, c
// K is stored transposed with a padded row so that the score loop (thread = key) reads
// consecutive banks and the transposing stores do not collide; V stays row-major for the
// accumulation (thread = output element).
struct DecodeLayout {
  int group = 0, head_dim = 0, tile = 0;
  __host__ __device__ std::int64_t q() const { return 0; }
  __host__ __device__ std::int64_t kt() const { return q() + std::int64_t{group} * head_dim; }
  __host__ __device__ std::int64_t v() const { return kt() + std::int64_t{head_dim} * (tile + 1); }
  __host__ __device__ std::int64_t p() const { return v() + std::int64_t{tile} * head_dim; }
  __host__ __device__ std::int64_t acc() const { return p() + std::int64_t{group} * tile; }
  __host__ __device__ std::int64_t stats() const { return acc() + std::int64_t{group} * head_dim; }
  __host__ __device__ std::int64_t floats() const { return stats() + 3 * std::int64_t{group}; }
};

// Block (row i, KV head, split s) over keys [s * split_keys, ...) of the row's positions 0..p.
// splits == 1: out (rows, n_heads, D) bf16 directly; else partial_acc (rows, n_heads, splits, D)
// unnormalised and partial_ml (rows, n_heads, splits, 2) = (m, l), m = -inf for no keys.
__global__ void __launch_bounds__(kThreads)
    decode_attention_kernel(bf16* out, float* partial_acc, float* partial_ml, const bf16* q,
                            const bf16* k_cache, const bf16* v_cache, const std::int32_t* slots,
                            const std::int32_t* positions, CacheGeometry g, DecodeLayout layout,
                            int splits, std::int64_t split_keys, float scale, bool wide) {
  extern __shared__ float shared[];
  const int kv_groups = g.n_kv_heads;
  const std::int64_t i = blockIdx.x / kv_groups;
  const int kv_head = static_cast<int>(blockIdx.x % kv_groups);
  const int split = static_cast<int>(blockIdx.y);
  const int group = layout.group;
  const int hd = layout.head_dim;
  const int tile = layout.tile;
  float* qs = shared + layout.q();
  float* kt = shared + layout.kt();
  float* vs = shared + layout.v();
  float* ps = shared + layout.p();
  float* acc = shared + layout.acc();
  float* ms = shared + layout.stats();
  float* ls = ms + group;
  float* cs = ls + group;

  const std::int64_t slot_row = cache_base(slots, positions, i, g);
  const std::int64_t keys = slot_row < 0 ? 0 : std::int64_t{positions[i]} + 1;
  const std::int64_t begin = split * split_keys;
  // The last split takes every key left, so a position past max_keys is still attended to.
  const std::int64_t end = split == splits - 1 ? keys : min(keys, begin + split_keys);
  const std::int64_t head0 = std::int64_t{kv_head} * group;  // the group's first query head
  const std::int64_t kv_stride = std::int64_t{g.n_kv_heads} * hd;

  for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
    qs[e] = to_float(q[(i * g.n_heads + head0) * hd + e]);
    acc[e] = 0.0F;
  }
  for (int j = threadIdx.x; j < group; j += blockDim.x) {
    ms[j] = -INFINITY;
    ls[j] = 0.0F;
  }
  __syncthreads();

  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  for (std::int64_t t0 = begin; t0 < end; t0 += tile) {
    const int n = static_cast<int>(min(std::int64_t{tile}, end - t0));
    // K^T and V of keys t0 .. t0 + n, converted to fp32
    const std::int64_t base = ((slot_row + t0) * g.n_kv_heads + kv_head) * hd;
    if (wide) {
      const int chunks = hd / 8;
      for (int e = threadIdx.x; e < n * chunks; e += blockDim.x) {
        const int t = e / chunks;
        const int d0 = (e % chunks) * 8;
        const std::int64_t at = base + t * kv_stride + d0;
        const Bf16x8 kx = *reinterpret_cast<const Bf16x8*>(k_cache + at);
        const Bf16x8 vx = *reinterpret_cast<const Bf16x8*>(v_cache + at);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          kt[(d0 + c) * (tile + 1) + t] = to_float(kx.v[c]);
          vs[t * hd + d0 + c] = to_float(vx.v[c]);
        }
      }
    } else {
      for (int e = threadIdx.x; e < n * hd; e += blockDim.x) {
        const int t = e / hd;
        const int d = e % hd;
        const std::int64_t at = base + t * kv_stride + d;
        kt[d * (tile + 1) + t] = to_float(k_cache[at]);
        vs[t * hd + d] = to_float(v_cache[at]);
      }
    }
    __syncthreads();
    // scores s = scale * q_j . k_t (the CPU's alpha * dot)
    for (int e = threadIdx.x; e < group * tile; e += blockDim.x) {
      const int j = e / tile;
      const int t = e % tile;
      if (t >= n) continue;
      const float* qj = qs + j * hd;
      float dot = 0.0F;
      for (int d = 0; d < hd; ++d) dot += qj[d] * kt[d * (tile + 1) + t];
      ps[j * tile + t] = scale * dot;
    }
    __syncthreads();
    // online softmax, a warp per head: m' = max(m, max s), p = exp(s - m'), l' = l c + sum p
    // with c = exp(m - m') (0 on the first tile: m = -inf)
    for (int j = warp; j < group; j += warps) {
      float tile_max = -INFINITY;
      for (int t = lane; t < n; t += kWarp) tile_max = fmaxf(tile_max, ps[j * tile + t]);
      tile_max = warp_max(tile_max);
      const float m_new = fmaxf(ms[j], tile_max);
      float sum = 0.0F;
      for (int t = lane; t < n; t += kWarp) {
        const float p = __expf(ps[j * tile + t] - m_new);
        ps[j * tile + t] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float c = __expf(ms[j] - m_new);
        cs[j] = c;
        ls[j] = ls[j] * c + sum;
        ms[j] = m_new;
      }
    }
    __syncthreads();
    // acc_j = acc_j c_j + sum_t p_jt v_t, a thread per (head, dimension)
    for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
      const int j = e / hd;
      const int d = e % hd;
      float a = acc[e] * cs[j];
      for (int t = 0; t < n; ++t) a += ps[j * tile + t] * vs[t * hd + d];
      acc[e] = a;
    }
    __syncthreads();  // the next tile overwrites k^T, v and p
  }

  if (splits == 1) {
    for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
      const int j = e / hd;
      // l = 0: a row outside the cache (nothing read), written as zeros
      out[(i * g.n_heads + head0) * hd + e] = to_bf16(ls[j] > 0.0F ? acc[e] / ls[j] : 0.0F);
    }
    return;
  }
  for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
    const int j = e / hd;
    const int d = e % hd;
    partial_acc[((i * g.n_heads + head0 + j) * splits + split) * hd + d] = acc[e];
  }
  for (int j = threadIdx.x; j < group; j += blockDim.x) {
    const std::int64_t at = ((i * g.n_heads + head0 + j) * splits + split) * 2;
    partial_ml[at] = ms[j];
    partial_ml[at + 1] = ls[j];
  }
}

// One block per (row, query head), a thread per dimension: out = sum_s acc_s exp(m_s - M) /
// sum_s l_s exp(m_s - M), M = max_s m_s; splits without keys (m = -inf) are skipped, their
// accumulators unwritten.
__global__ void decode_merge_kernel(bf16* out, const float* partial_acc, const float* partial_ml,
                                    int splits, int head_dim) {
  const std::int64_t row_head = blockIdx.x;
  const float* ml = partial_ml + row_head * splits * 2;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, ml[s * 2]);
  float l = 0.0F;
  for (int s = 0; s < splits; ++s) {
    if (ml[s * 2] != -INFINITY) l += ml[s * 2 + 1] * __expf(ml[s * 2] - m);
  }
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float a = 0.0F;
    for (int s = 0; s < splits; ++s) {
      if (ml[s * 2] == -INFINITY) continue;
      a += partial_acc[(row_head * splits + s) * head_dim + d] * __expf(ml[s * 2] - m);
    }
    out[row_head * head_dim + d] = to_bf16(l > 0.0F ? a / l : 0.0F);
  }
}

// The largest tile (at most kMaxTile keys) whose layout fits the shared memory.
DecodeLayout decode_layout(const CacheGeometry& g) {
  DecodeLayout layout{.group = g.n_heads / g.n_kv_heads, .head_dim = g.head_dim, .tile = kMaxTile};
  while (layout.tile > 1 &&
         static_cast<std::size_t>(layout.floats()) * sizeof(float) > kMaxSharedBytes) {
    layout.tile /= 2;
  }
  if (static_cast<std::size_t>(layout.floats()) * sizeof(float) > kMaxSharedBytes) {
    // (std::to_string: nvcc cannot evaluate fmt's compile-time format strings)
    throw core::internal_error("cuda decode_attention: " + std::to_string(layout.group) +
                               " query heads per KV head of dimension " +
                               std::to_string(layout.head_dim) + " need more than " +
                               std::to_string(kMaxSharedBytes) + " bytes of shared memory");
  }
  return layout;
}

}  // namespace

void kv_cache_write(BFloat16* k_cache, BFloat16* v_cache, const BFloat16* k, const BFloat16* v,
                    const std::int32_t* slots, const std::int32_t* positions,
                    const CacheGeometry& g, cudaStream_t stream) {
  const std::int64_t per_row = std::int64_t{g.n_kv_heads} * g.head_dim;
  if (g.rows == 0 || per_row == 0) return;
  const bool wide = g.head_dim % 8 == 0 && aligned16(k_cache, v_cache, k, v);
  const std::int64_t threads = g.rows * per_row / (wide ? 8 : 1);
  kv_cache_write_kernel<<<blocks_for(threads, kCopyThreads), kCopyThreads, 0, stream>>>(
      device_cast(k_cache), device_cast(v_cache), device_cast(k), device_cast(v), slots, positions,
      g, per_row, wide);
  check_launch("kv_cache_write");
}

DecodePlan plan_decode_attention(const CacheGeometry& g, int max_keys) {
  DecodePlan plan;
  const std::int64_t blocks = g.rows * g.n_kv_heads;
  if (blocks > 0 && blocks < kTargetBlocks && max_keys > kMinSplitKeys) {
    const std::int64_t wanted = (kTargetBlocks + blocks - 1) / blocks;
    const std::int64_t most = (max_keys + kMinSplitKeys - 1) / kMinSplitKeys;
    plan.splits = static_cast<int>(std::min({wanted, most, kMaxSplits}));
  }
  plan.split_keys = (max_keys + plan.splits - 1) / plan.splits;
  if (plan.splits > 1) {
    const std::int64_t partials = g.rows * g.n_heads * plan.splits;
    plan.workspace_bytes =
        align256(static_cast<std::size_t>(partials * g.head_dim) * sizeof(float)) +
        static_cast<std::size_t>(partials * 2) * sizeof(float);
  }
  return plan;
}

void decode_attention(BFloat16* out, const BFloat16* q, const BFloat16* k_cache,
                      const BFloat16* v_cache, const std::int32_t* slots,
                      const std::int32_t* positions, const CacheGeometry& g, const DecodePlan& plan,
                      void* workspace, cudaStream_t stream) {
  if (g.rows == 0) return;
  const DecodeLayout layout = decode_layout(g);
  const bool wide = g.head_dim % 8 == 0 && aligned16(k_cache, v_cache);
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.head_dim)));
  float* partial_acc = nullptr;
  float* partial_ml = nullptr;
  if (plan.splits > 1) {
    const std::int64_t partials = g.rows * g.n_heads * plan.splits;
    partial_acc = static_cast<float*>(workspace);
    partial_ml = reinterpret_cast<float*>(
        static_cast<char*>(workspace) +
        align256(static_cast<std::size_t>(partials * g.head_dim) * sizeof(float)));
  }
  const dim3 grid(static_cast<unsigned int>(g.rows * g.n_kv_heads),
                  static_cast<unsigned int>(plan.splits));
  const std::size_t shared = static_cast<std::size_t>(layout.floats()) * sizeof(float);
  decode_attention_kernel<<<grid, kThreads, shared, stream>>>(
      device_cast(out), partial_acc, partial_ml, device_cast(q), device_cast(k_cache),
      device_cast(v_cache), slots, positions, g, layout, plan.splits, plan.split_keys, scale, wide);
  check_launch("decode attention");
  if (plan.splits == 1) return;
  decode_merge_kernel<<<static_cast<unsigned int>(g.rows * g.n_heads), kThreads, 0, stream>>>(
      device_cast(out), partial_acc, partial_ml, plan.splits, g.head_dim);
  check_launch("decode attention: merge the splits");
}

}  // namespace l3::cuda
