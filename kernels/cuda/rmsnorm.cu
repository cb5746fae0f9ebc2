// RMSNorm forward and backward, one block per row, statistics in fp32. The weight gradient is
// reduced over fixed chunks of rows into fp32 partials, then over the chunks in order.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kRowsPerChunk = 32;
// The backward keeps a chunk's dw partial sums (hidden floats) in shared memory up to this size:
// 48 KiB per block, static and dynamic together, is the limit without an opt-in, and the block
// reduction's scratch takes a little of it. Wider rows (hidden > 12032, e.g. 16384 for a
// 405B-sized model) add up in the chunk's row of `partials` in global memory instead; it is
// mostly L2-resident, and each thread still owns its columns.
constexpr std::size_t kMaxSharedPartialBytes = 47 * 1024;

__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, const bf16* x, const bf16* w,
                                       std::int64_t hidden, float eps) {
  __shared__ float scratch[kWarp];
  const std::int64_t row = blockIdx.x;
  const bf16* xr = x + row * hidden;
  bf16* yr = out + row * hidden;
  float sum = 0.0F;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = to_float(xr[i]);
    sum += v * v;
  }
  sum = block_sum(sum, scratch);
  const float inv = 1.0F / sqrtf(sum / static_cast<float>(hidden) + eps);
  if (threadIdx.x == 0) rstd[row] = inv;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    yr[i] = to_bf16((to_float(xr[i]) * inv) * to_float(w[i]));
  }
}

// The same with 16-byte accesses: hidden % 8 == 0 and x, out, w 16-byte aligned.
__global__ void rmsnorm_forward_vec_kernel(bf16* out, float* rstd, const bf16* x, const bf16* w,
                                           std::int64_t hidden, float eps) {
  __shared__ float scratch[kWarp];
  const std::int64_t row = blockIdx.x;
  const std::int64_t chunks = hidden / 8;
  const auto* xr = reinterpret_cast<const Bf16x8*>(x + row * hidden);
  const auto* wv = reinterpret_cast<const Bf16x8*>(w);
  auto* yr = reinterpret_cast<Bf16x8*>(out + row * hidden);
  float sum = 0.0F;
  for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const Bf16x8 v = xr[c];
#pragma unroll
    for (int j = 0; j < 8; ++j) sum += to_float(v.v[j]) * to_float(v.v[j]);
  }
  sum = block_sum(sum, scratch);
  const float inv = 1.0F / sqrtf(sum / static_cast<float>(hidden) + eps);
  if (threadIdx.x == 0) rstd[row] = inv;
  for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const Bf16x8 v = xr[c];
    const Bf16x8 wc = wv[c];
    Bf16x8 y;
#pragma unroll
    for (int j = 0; j < 8; ++j) y.v[j] = to_bf16((to_float(v.v[j]) * inv) * to_float(wc.v[j]));
    yr[c] = y;
  }
}

// One block per chunk of rows; the chunk's `hidden` dw partial sums in dynamic shared memory, or in
// its row of `partials` when they do not fit (kMaxSharedPartialBytes).
__global__ void rmsnorm_backward_kernel(bf16* dx, float* partials, const bf16* dout, const bf16* x,
                                        const bf16* w, const float* rstd, std::int64_t rows,
                                        std::int64_t hidden, bool partials_in_global) {
  extern __shared__ float shared_partials[];
  __shared__ float scratch[kWarp];
  float* chunk_partials = partials + blockIdx.x * hidden;
  float* dw_partial = partials_in_global ? chunk_partials : shared_partials;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dw_partial[i] = 0.0F;
  const std::int64_t first = blockIdx.x * kRowsPerChunk;
  const std::int64_t last = min(first + kRowsPerChunk, rows);
  for (std::int64_t row = first; row < last; ++row) {
    const bf16* xr = x + row * hidden;
    const bf16* gr = dout + row * hidden;
    bf16* dxr = dx + row * hidden;
    const float inv = rstd[row];
    float dot = 0.0F;  // sum of (g * w) * xhat
    for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
      dot += to_float(gr[i]) * to_float(w[i]) * (to_float(xr[i]) * inv);
    }
    const float mean_dot = block_sum(dot, scratch) / static_cast<float>(hidden);
    for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
      const float g = to_float(gr[i]);
      const float xhat = to_float(xr[i]) * inv;
      dxr[i] = to_bf16(to_float(dxr[i]) + inv * (g * to_float(w[i]) - xhat * mean_dot));
      dw_partial[i] += g * xhat;  // each thread owns its columns: no race
    }
  }
  if (partials_in_global) return;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) chunk_partials[i] = dw_partial[i];
}

// The same with 16-byte accesses (hidden % 8 == 0, dx, dout, x, w 16-byte aligned); each thread
// owns eight adjacent columns of dw_partial.
__global__ void rmsnorm_backward_vec_kernel(bf16* dx, float* partials, const bf16* dout,
                                            const bf16* x, const bf16* w, const float* rstd,
                                            std::int64_t rows, std::int64_t hidden,
                                            bool partials_in_global) {
  extern __shared__ float shared_partials[];
  __shared__ float scratch[kWarp];
  float* chunk_partials = partials + blockIdx.x * hidden;
  float* dw_partial = partials_in_global ? chunk_partials : shared_partials;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dw_partial[i] = 0.0F;
  __syncthreads();  // a thread's eight columns were zeroed by other threads
  const std::int64_t chunks = hidden / 8;
  const auto* wv = reinterpret_cast<const Bf16x8*>(w);
  const std::int64_t first = blockIdx.x * kRowsPerChunk;
  const std::int64_t last = min(first + kRowsPerChunk, rows);
  for (std::int64_t row = first; row < last; ++row) {
    const auto* xr = reinterpret_cast<const Bf16x8*>(x + row * hidden);
    const auto* gr = reinterpret_cast<const Bf16x8*>(dout + row * hidden);
    auto* dxr = reinterpret_cast<Bf16x8*>(dx + row * hidden);
    const float inv = rstd[row];
    float dot = 0.0F;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const Bf16x8 xv = xr[c];
      const Bf16x8 gv = gr[c];
      const Bf16x8 wc = wv[c];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        dot += to_float(gv.v[j]) * to_float(wc.v[j]) * (to_float(xv.v[j]) * inv);
    }
    const float mean_dot = block_sum(dot, scratch) / static_cast<float>(hidden);
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const Bf16x8 xv = xr[c];
      const Bf16x8 gv = gr[c];
      const Bf16x8 wc = wv[c];
      Bf16x8 d = dxr[c];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float g = to_float(gv.v[j]);
        const float xhat = to_float(xv.v[j]) * inv;
        d.v[j] = to_bf16(to_float(d.v[j]) + inv * (g * to_float(wc.v[j]) - xhat * mean_dot));
        dw_partial[c * 8 + j] += g * xhat;
      }
      dxr[c] = d;
    }
  }
  __syncthreads();  // dw_partial written by other threads' columns is read below
  if (partials_in_global) return;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) chunk_partials[i] = dw_partial[i];
}

template <typename Grad>  // bf16 or float
__global__ void rmsnorm_dw_kernel(Grad* dw, const float* partials, std::int64_t chunks,
                                  std::int64_t hidden) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= hidden) return;
  float sum = 0.0F;
  for (std::int64_t c = 0; c < chunks; ++c) sum += partials[c * hidden + i];  // chunk order
  add_to(dw[i], sum);
}

std::int64_t chunks(std::int64_t rows) { return (rows + kRowsPerChunk - 1) / kRowsPerChunk; }

}  // namespace

void rmsnorm_forward(BFloat16* out, float* rstd, const BFloat16* x, const BFloat16* w,
                     std::int64_t rows, std::int64_t hidden, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  if (hidden % 8 == 0 && aligned16(out, x, w)) {
    rmsnorm_forward_vec_kernel<<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(
        device_cast(out), rstd, device_cast(x), device_cast(w), hidden, eps);
    check_launch("rmsnorm forward (vectorised)");
    return;
  }
  rmsnorm_forward_kernel<<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(
      device_cast(out), rstd, device_cast(x), device_cast(w), hidden, eps);
  check_launch("rmsnorm forward");
}

std::int64_t rmsnorm_partials(std::int64_t rows, std::int64_t hidden) {
  return chunks(rows) * hidden;
}

namespace {

template <typename Grad>
void rmsnorm_backward_into(BFloat16* dx, Grad* dw, const BFloat16* dout, const BFloat16* x,
                           const BFloat16* w, const float* rstd, std::int64_t rows,
                           std::int64_t hidden, float* partials, cudaStream_t stream) {
  if (rows == 0) return;
  const std::size_t partial_bytes = static_cast<std::size_t>(hidden) * sizeof(float);
  const bool in_global = partial_bytes > kMaxSharedPartialBytes;
  const std::size_t shared = in_global ? 0 : partial_bytes;
  if (hidden % 8 == 0 && aligned16(dx, dout, x, w)) {
    rmsnorm_backward_vec_kernel<<<static_cast<unsigned int>(chunks(rows)), kThreads, shared,
                                  stream>>>(device_cast(dx), partials, device_cast(dout),
                                            device_cast(x), device_cast(w), rstd, rows, hidden,
                                            in_global);
    check_launch("rmsnorm backward (vectorised)");
  } else {
    rmsnorm_backward_kernel<<<static_cast<unsigned int>(chunks(rows)), kThreads, shared, stream>>>(
        device_cast(dx), partials, device_cast(dout), device_cast(x), device_cast(w), rstd, rows,
        hidden, in_global);
    check_launch("rmsnorm backward");
  }
  if (dw == nullptr) return;  // a frozen norm: the partial sums go unused
  rmsnorm_dw_kernel<<<blocks_for(hidden, kThreads), kThreads, 0, stream>>>(
      device_cast(dw), partials, chunks(rows), hidden);
  check_launch("rmsnorm backward (weights)");
}

}  // namespace

void rmsnorm_backward(BFloat16* dx, BFloat16* dw, const BFloat16* dout, const BFloat16* x,
                      const BFloat16* w, const float* rstd, std::int64_t rows, std::int64_t hidden,
                      float* partials, cudaStream_t stream) {
  rmsnorm_backward_into(dx, dw, dout, x, w, rstd, rows, hidden, partials, stream);
}
void rmsnorm_backward(BFloat16* dx, float* dw, const BFloat16* dout, const BFloat16* x,
                      const BFloat16* w, const float* rstd, std::int64_t rows, std::int64_t hidden,
                      float* partials, cudaStream_t stream) {
  rmsnorm_backward_into(dx, dw, dout, x, w, rstd, rows, hidden, partials, stream);
}

}  // namespace l3::cuda
