// RoPE in place, Hugging Face's rotate-half pairing, tables (positions, head_dim/2) in fp32.
// Eight pairs per thread with 16-byte accesses (x in bf16, the tables in fp32) when head_dim/2
// is a multiple of 8 and x is 16-byte aligned (every Llama 3 shape); one pair per thread
// otherwise. Both paths share the rotation, so their results are identical bit for bit.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {
constexpr int kThreads = 256;

// (x1, x2) -> (x1 c - x2 s, x2 c + x1 s); sign -1 gives the transpose (the backward).
__device__ __forceinline__ void rotate(bf16& a, bf16& b, float c, float s) {
  const float x1 = to_float(a);
  const float x2 = to_float(b);
  a = to_bf16(x1 * c - x2 * s);
  b = to_bf16(x2 * c + x1 * s);
}

// One thread per (token, head, pair i < head_dim/2).
__global__ void rope_kernel(bf16* x, const std::int32_t* positions, const float* cos,
                            const float* sin, std::int64_t pairs_total, int heads, int half,
                            float sign) {
  const std::int64_t id = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (id >= pairs_total) return;
  const int i = static_cast<int>(id % half);
  const std::int64_t head_row = id / half;  // token * heads + head
  const std::int64_t token = head_row / heads;
  const std::int64_t table = static_cast<std::int64_t>(positions[token]) * half + i;
  bf16* v = x + head_row * 2 * half;
  rotate(v[i], v[i + half], cos[table], sign * sin[table]);
}

// One thread per (token, head, group of 8 pairs): pairs i0..i0+7 and their partners
// i0+half..i0+half+7, each one 16-byte load and store; cos/sin two float4 loads each.
__global__ void rope_vec_kernel(bf16* x, const std::int32_t* positions, const float* cos,
                                const float* sin, std::int64_t groups_total, int heads, int half,
                                float sign) {
  const std::int64_t id = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (id >= groups_total) return;
  const int groups = half / 8;
  const int i0 = static_cast<int>(id % groups) * 8;
  const std::int64_t head_row = id / groups;
  const std::int64_t token = head_row / heads;
  const std::int64_t table = static_cast<std::int64_t>(positions[token]) * half + i0;
  const float4 c0 = *reinterpret_cast<const float4*>(cos + table);
  const float4 c1 = *reinterpret_cast<const float4*>(cos + table + 4);
  const float4 s0 = *reinterpret_cast<const float4*>(sin + table);
  const float4 s1 = *reinterpret_cast<const float4*>(sin + table + 4);
  const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
  const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
  bf16* row = x + head_row * 2 * half;
  Bf16x8 a = *reinterpret_cast<const Bf16x8*>(row + i0);
  Bf16x8 b = *reinterpret_cast<const Bf16x8*>(row + half + i0);
#pragma unroll
  for (int j = 0; j < 8; ++j) rotate(a.v[j], b.v[j], c[j], sign * s[j]);
  *reinterpret_cast<Bf16x8*>(row + i0) = a;
  *reinterpret_cast<Bf16x8*>(row + half + i0) = b;
}
// Decoding's RoPE and cache write: one thread per (row, head, pair i < head_dim/2) over the row's
// q_heads query heads, then its KV heads (rotated, and written to the cache), then its value
// heads (copied to the cache). A row whose slot or position lies outside the cache is rotated
// and not written (kv_cache_write's rule). The rotation is rope_kernel's, so the values are
// rope's bit for bit.
__global__ void rope_kv_cache_write_kernel(bf16* q, bf16* k, const bf16* v, bf16* k_cache,
                                           bf16* v_cache, const std::int32_t* slots,
                                           const std::int32_t* positions, const float* cos,
                                           const float* sin, std::int64_t pairs_total, int q_heads,
                                           CacheGeometry g, int half) {
  const std::int64_t id = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (id >= pairs_total) return;
  const int i = static_cast<int>(id % half);
  const int heads = q_heads + 2 * g.n_kv_heads;
  const std::int64_t head_row = id / half;
  const std::int64_t row = head_row / heads;
  const int head = static_cast<int>(head_row % heads);
  const std::int64_t position = positions[row];
  const std::int64_t table = position * half + i;
  if (head < q_heads) {
    bf16* x = q + (row * q_heads + head) * 2 * half;
    rotate(x[i], x[i + half], cos[table], sin[table]);
    return;
  }
  const std::int64_t slot = slots[row];
  const bool cached = slot >= 0 && slot < g.slots && position >= 0 && position < g.capacity;
  const int kv_head =
      head < q_heads + g.n_kv_heads ? head - q_heads : head - q_heads - g.n_kv_heads;
  const std::int64_t at = (row * g.n_kv_heads + kv_head) * 2 * half;
  const std::int64_t to = ((slot * g.capacity + position) * g.n_kv_heads + kv_head) * 2 * half;
  if (head < q_heads + g.n_kv_heads) {
    bf16* x = k + at;
    rotate(x[i], x[i + half], cos[table], sin[table]);
    if (cached) {
      k_cache[to + i] = x[i];
      k_cache[to + i + half] = x[i + half];
    }
    return;
  }
  if (cached) {
    v_cache[to + i] = v[at + i];
    v_cache[to + i + half] = v[at + i + half];
  }
}

}  // namespace

void rope_kv_cache_write(BFloat16* q, BFloat16* k, const BFloat16* v, BFloat16* k_cache,
                         BFloat16* v_cache, const std::int32_t* slots,
                         const std::int32_t* positions, const float* cos, const float* sin,
                         int q_heads, const CacheGeometry& g, cudaStream_t stream) {
  const int half = g.head_dim / 2;
  const std::int64_t total = g.rows * (q_heads + 2 * std::int64_t{g.n_kv_heads}) * half;
  if (total == 0) return;
  rope_kv_cache_write_kernel<<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
      device_cast(q), device_cast(k), device_cast(v), device_cast(k_cache), device_cast(v_cache),
      slots, positions, cos, sin, total, q_heads, g, half);
  check_launch("rope and kv cache write");
}

void rope(BFloat16* x, const std::int32_t* positions, const float* cos, const float* sin,
          std::int64_t n, int heads, int head_dim, float sign, cudaStream_t stream) {
  const int half = head_dim / 2;
  const std::int64_t total = n * heads * half;
  if (total == 0) return;
  if (half % 8 == 0 && aligned16(x, cos, sin)) {
    const std::int64_t groups = total / 8;
    rope_vec_kernel<<<blocks_for(groups, kThreads), kThreads, 0, stream>>>(
        device_cast(x), positions, cos, sin, groups, heads, half, sign);
    check_launch("rope (vectorised)");
    return;
  }
  rope_kernel<<<blocks_for(total, kThreads), kThreads, 0, stream>>>(device_cast(x), positions, cos,
                                                                    sin, total, heads, half, sign);
  check_launch("rope");
}

}  // namespace l3::cuda
