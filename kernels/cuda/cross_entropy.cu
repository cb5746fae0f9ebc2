// The row-wise parts of the fused lm_head + cross-entropy: gathering the counted rows' hidden
// states (the host lists them: no selection on the device, nothing read back), and the
// softmax / loss / gradient of one block of logits.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/softmax_stats.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

// Row copies by an index list: out[r] = h[rows[r]] (gather) or h[rows[r]] = in[r] (scatter),
// one block per row; 16-byte accesses when the rows allow it (hidden % 8 == 0, aligned bases).
template <typename T>
__device__ __forceinline__ void copy_row(T* dst, const T* src, std::int64_t count) {
  for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) dst[i] = src[i];
}

__global__ void gather_rows_kernel(bf16* out, const bf16* h, const std::int32_t* rows,
                                   std::int64_t hidden, bool wide) {
  const std::int64_t r = blockIdx.x;
  const bf16* src = h + static_cast<std::int64_t>(rows[r]) * hidden;
  bf16* dst = out + r * hidden;
  if (wide) {
    copy_row(reinterpret_cast<Bf16x8*>(dst), reinterpret_cast<const Bf16x8*>(src), hidden / 8);
  } else {
    copy_row(dst, src, hidden);
  }
}

__global__ void scatter_rows_kernel(bf16* h, const bf16* in, const std::int32_t* rows,
                                    std::int64_t hidden, bool wide) {
  const std::int64_t r = blockIdx.x;
  bf16* dst = h + static_cast<std::int64_t>(rows[r]) * hidden;
  const bf16* src = in + r * hidden;
  if (wide) {
    copy_row(reinterpret_cast<Bf16x8*>(dst), reinterpret_cast<const Bf16x8*>(src), hidden / 8);
  } else {
    copy_row(dst, src, hidden);
  }
}

// Four bf16 values in one 8-byte store.
struct alignas(8) Bf16x4 {
  bf16 v[4];
};

// One block per row of logits. Rows whose logits (and gradient) allow it are read as float4 and
// written four bf16 at a time (vocab % 4 == 0 and the row 16-byte aligned: Llama 3's 128256).
// row_scale (may be null) weighs each row's gradient; entropy (may be null) receives the row's
// softmax entropy, log(sum) - sum_j exp(z_j - max) (z_j - max) / sum, from one more read of the
// row (the logits stay in L2 for the gradient's read that follows).
__global__ void softmax_cross_entropy_kernel(float* loss, bf16* dlogits, float* entropy,
                                             const float* logits, const std::int32_t* targets,
                                             const float* row_scale, std::int64_t vocab,
                                             float grad_scale) {
  const std::int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  bf16* d = dlogits == nullptr ? nullptr : dlogits + row * vocab;
  const bool wide = vocab % 4 == 0 && reinterpret_cast<std::uintptr_t>(z) % 16U == 0U &&
                    reinterpret_cast<std::uintptr_t>(d) % 8U == 0U;
  const std::int64_t quads = wide ? vocab / 4 : 0;
  // A float4 view only where it is one (a misaligned vector pointer faults on its first access).
  const auto* z4 = wide ? reinterpret_cast<const float4*>(z) : nullptr;

  SoftmaxStats stats;
  for (std::int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
    const float4 v = z4[q];
    stats.add(v.x);
    stats.add(v.y);
    stats.add(v.z);
    stats.add(v.w);
  }
  for (std::int64_t j = quads * 4 + threadIdx.x; j < vocab; j += blockDim.x) stats.add(z[j]);
  stats = block_merge(stats);

  const std::int32_t target = targets[row];
  if (threadIdx.x == 0) loss[row] = stats.max + logf(stats.sum) - z[target];
  if (entropy != nullptr) {
    __shared__ float scratch[kWarp];
    auto term = [&](float x) {
      const float e = __expf(x - stats.max);
      return e > 0.0F ? e * (x - stats.max) : 0.0F;  // not 0 * -inf for a -inf logit
    };
    float dot = 0.0F;
    for (std::int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
      const float4 v = z4[q];
      dot += term(v.x) + term(v.y) + term(v.z) + term(v.w);
    }
    for (std::int64_t j = quads * 4 + threadIdx.x; j < vocab; j += blockDim.x) dot += term(z[j]);
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) entropy[row] = logf(stats.sum) - dot / stats.sum;
  }
  if (d == nullptr) return;
  // dlogits = scale * (softmax - onehot(target)), scale = grad_scale (* row_scale[row])
  const float scale = row_scale == nullptr ? grad_scale : grad_scale * row_scale[row];
  const float factor = scale / stats.sum;
  auto grad = [&](std::int64_t j, float x) {
    const float p = __expf(x - stats.max) * factor;
    return to_bf16(j == target ? p - scale : p);
  };
  for (std::int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
    const float4 v = z4[q];
    const std::int64_t j = q * 4;
    reinterpret_cast<Bf16x4*>(d)[q] =
        Bf16x4{{grad(j, v.x), grad(j + 1, v.y), grad(j + 2, v.z), grad(j + 3, v.w)}};
  }
  for (std::int64_t j = quads * 4 + threadIdx.x; j < vocab; j += blockDim.x) d[j] = grad(j, z[j]);
}

}  // namespace

void gather_rows(BFloat16* out, const BFloat16* h, const std::int32_t* rows, std::int64_t count,
                 std::int64_t hidden, cudaStream_t stream) {
  if (count == 0) return;
  gather_rows_kernel<<<static_cast<unsigned int>(count), kThreads, 0, stream>>>(
      device_cast(out), device_cast(h), rows, hidden, hidden % 8 == 0 && aligned16(out, h));
  check_launch("gather rows");
}

void scatter_rows(BFloat16* h, const BFloat16* in, const std::int32_t* rows, std::int64_t count,
                  std::int64_t hidden, cudaStream_t stream) {
  if (count == 0) return;
  scatter_rows_kernel<<<static_cast<unsigned int>(count), kThreads, 0, stream>>>(
      device_cast(h), device_cast(in), rows, hidden, hidden % 8 == 0 && aligned16(h, in));
  check_launch("scatter rows");
}

void softmax_cross_entropy(float* loss, BFloat16* dlogits, const float* logits,
                           const std::int32_t* targets, const float* row_scale, std::int64_t rows,
                           std::int64_t vocab, float grad_scale, cudaStream_t stream,
                           float* entropy) {
  if (rows == 0) return;
  softmax_cross_entropy_kernel<<<static_cast<unsigned int>(rows), kThreads * 4, 0, stream>>>(
      loss, dlogits == nullptr ? nullptr : device_cast(dlogits), entropy, logits, targets,
      row_scale, vocab, grad_scale);
  check_launch("softmax cross-entropy");
}

}  // namespace l3::cuda
