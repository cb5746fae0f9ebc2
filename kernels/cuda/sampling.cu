// The next token of each row of logits on the device (kernels::SampleTokensArgs states the rule),
// without sorting the vocabulary and without a copy of the logits to the host.
//
// Two kernels, one block per row each:
//  - row statistics: the softmax statistics of the whole row with the cross-entropy kernel's
//    block size and loop (cross_entropy.cu), so that a token's log-probability is bit for bit
//    the negated row loss the training forward computes on this backend, and the first largest
//    logit among the candidates; greedy rows end here.
//  - the draw: the kept set is found by bisection with block reductions instead of a sort. The
//    weights w = exp((l - max) / T) are a non-decreasing function of the logit, so the k-th
//    largest weight is the weight of the k-th largest logit: a bisection over the logits' order
//    keys (the float bits made unsigned-ordered) counting the keys above a threshold finds it.
//    The ids whose weight equals the threshold weight (a plateau of logits, usually the one
//    logit) are then kept by lower id up to the count needed, that id cut-off found by a second
//    bisection. Top-p likewise: a bisection over the keys on the kept mass above a threshold
//    finds the nucleus's smallest weight, its ties kept by lower id. The draw then walks the
//    kept ids in ascending order: each thread sums a contiguous range of ids, a block scan of
//    the sums gives every range its running start, and the range where the running weight
//    passes u * total finds the token. Sums of weights are in double, as the CPU's.
#include <cstdint>
#include <cstring>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/scratch_sizes.hpp"
#include "kernels/cuda/softmax_stats.cuh"

namespace l3::cuda {

namespace {

constexpr int kStatsThreads = 1024;  // the cross-entropy kernel's (the loss's summation order)
constexpr int kDrawThreads = 256;
constexpr std::int64_t kNoId = INT64_MAX;

// Order keys: a < b as floats (-0 before +0, NaN aside) iff key(a) < key(b) as unsigned.
__device__ __forceinline__ std::uint32_t order_key(float x) {
  std::uint32_t bits = 0;
  memcpy(&bits, &x, sizeof bits);
  return (bits & 0x80000000U) != 0U ? ~bits : bits | 0x80000000U;
}
__device__ __forceinline__ float key_value(std::uint32_t key) {
  const std::uint32_t bits = (key & 0x80000000U) != 0U ? key & 0x7FFFFFFFU : ~key;
  float x = 0.0F;
  memcpy(&x, &bits, sizeof x);
  return x;
}

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Min {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};
struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};

// `op` over the block, in every thread (blockDim.x a multiple of 32); `scratch` 32 values of
// shared memory. Synchronises the block (the scratch may still be read from a previous call).
template <typename T, typename Op>
__device__ T block_reduce(T v, T* scratch, Op op, T identity) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = op(v, __shfl_xor_sync(0xffffffffU, v, offset));
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x) / kWarp ? scratch[lane] : identity;
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = op(v, __shfl_xor_sync(0xffffffffU, v, offset));
  return v;
}

// The larger logit, the lower id on ties; id == candidates: none yet.
struct Best {
  float value;
  std::int64_t id;
  __device__ bool beats(const Best& o) const {
    return value > o.value || (value == o.value && id < o.id);
  }
};

__device__ Best block_best(Best b, float* values, std::int64_t* ids) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const auto warp_best = [](Best x) {
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const Best o{__shfl_xor_sync(0xffffffffU, x.value, offset),
                   __shfl_xor_sync(0xffffffffU, x.id, offset)};
      if (o.beats(x)) x = o;
    }
    return x;
  };
  b = warp_best(b);
  __syncthreads();
  if (lane == 0) {
    values[warp] = b.value;
    ids[warp] = b.id;
  }
  __syncthreads();
  Best t{-INFINITY, kNoId};
  if (lane < static_cast<int>(blockDim.x) / kWarp) t = {values[lane], ids[lane]};
  return warp_best(t);
}

// log p(token) as softmax_cross_entropy_kernel computes the row's loss (its negative); max and
// sum are the statistics of the scaled row, logit the token's scaled logit
__device__ __forceinline__ float token_logprob(float max, float sum, float logit) {
  const float loss = max + logf(sum) - logit;
  return -loss;
}

// One block of kStatsThreads per row: the softmax statistics of all `vocab` logits times
// `scale` (the cross-entropy kernel's loop and merge on the logits it gets from a GEMM with
// alpha = scale), and the first largest of the `candidates` first (unscaled: the same order).
// greedy: writes the token and its log-probability; else stats (rows, 2) = (max, sum) and
// best (rows) for the draw.
__global__ void __launch_bounds__(kStatsThreads)
    row_stats_kernel(std::int32_t* tokens, float* logprobs, float* stats, std::int32_t* best,
                     const float* logits, std::int64_t vocab, std::int64_t candidates, bool greedy,
                     float scale) {
  __shared__ float values[kWarp];
  __shared__ std::int64_t ids[kWarp];
  const std::int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  const bool wide = vocab % 4 == 0 && reinterpret_cast<std::uintptr_t>(z) % 16U == 0U;
  const std::int64_t quads = wide ? vocab / 4 : 0;
  const auto* z4 = wide ? reinterpret_cast<const float4*>(z) : nullptr;
  SoftmaxStats s;
  for (std::int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
    const float4 v = z4[q];
    s.add(__fmul_rn(scale, v.x));
    s.add(__fmul_rn(scale, v.y));
    s.add(__fmul_rn(scale, v.z));
    s.add(__fmul_rn(scale, v.w));
  }
  for (std::int64_t j = quads * 4 + threadIdx.x; j < vocab; j += blockDim.x)
    s.add(__fmul_rn(scale, z[j]));
  s = block_merge(s);

  // Ascending ids per thread: a later equal logit never replaces the first (a lone -inf row
  // still picks its first id: -inf ties the start and id < candidates).
  Best b{-INFINITY, candidates};
  for (std::int64_t j = threadIdx.x; j < candidates; j += blockDim.x) {
    const Best c{z[j], j};
    if (c.beats(b)) b = c;
  }
  b = block_best(b, values, ids);
  if (threadIdx.x != 0) return;
  const auto token = static_cast<std::int32_t>(b.id);
  if (greedy) {
    tokens[row] = token;
    if (logprobs != nullptr)
      logprobs[row] = token_logprob(s.max, s.sum, __fmul_rn(scale, z[token]));
  } else {
    stats[row * 2] = s.max;
    stats[row * 2 + 1] = s.sum;
    best[row] = token;
  }
}

// A row of candidate logits seen through the rule's weights and order keys.
struct RowView {
  const float* z;
  std::int64_t candidates;
  double max;  // the largest candidate logit
  double temperature;
  __device__ double weight(float x) const {
    return exp((static_cast<double>(x) - max) / temperature);  // <= 1: never overflows
  }
};

// The kept ids of a selection step: key > above, or above >= key >= from with id < ids (the
// ties at its threshold weight, lower ids first). Everything: above = UINT32_MAX, from = 0,
// ids = candidates.
struct KeptRange {
  std::uint32_t from = 0;
  std::uint32_t above = 0xFFFFFFFFU;
  std::int64_t ids = 0;
  __device__ bool keeps(std::uint32_t key, std::int64_t id) const {
    return key > above || (key >= from && id < ids);
  }
};

// The ids (plateau from..to of keys, `needed` of them) kept by lower id: the smallest cut-off
// I with needed ties below it, by bisection over ids, among the ids `prior` keeps.
__device__ std::int64_t tie_cutoff(const RowView& r, const KeptRange& prior, std::uint32_t from,
                                   std::uint32_t to, std::int64_t needed, std::int64_t ties,
                                   std::int64_t* scratch) {
  if (needed >= ties) return r.candidates;
  if (needed <= 0) return 0;
  std::int64_t lo = 0;  // fewer than `needed` ties below
  std::int64_t hi = r.candidates;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    std::int64_t count = 0;
    for (std::int64_t j = threadIdx.x; j < mid; j += blockDim.x) {
      const std::uint32_t key = order_key(r.z[j]);
      count += key >= from && key <= to && prior.keeps(key, j) ? 1 : 0;
    }
    count = block_reduce(count, scratch, Sum{}, std::int64_t{0});
    if (count >= needed) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

// The plateau of keys whose weight is `tau` among the ids `prior` keeps, the mass and count of
// those above it, and its size.
struct Plateau {
  std::uint32_t from = 0xFFFFFFFFU, to = 0;
  double mass_above = 0.0;
  std::int64_t above = 0, ties = 0;
};

struct DrawScratch {
  double sums[kWarp];
  std::int64_t counts[kWarp];
  std::uint32_t keys[kWarp];
  double scan[kDrawThreads];
};

__device__ Plateau plateau(const RowView& r, const KeptRange& prior, double tau, DrawScratch& sh) {
  Plateau p;
  for (std::int64_t j = threadIdx.x; j < r.candidates; j += blockDim.x) {
    const float x = r.z[j];
    const std::uint32_t key = order_key(x);
    if (!prior.keeps(key, j)) continue;
    const double w = r.weight(x);
    if (w > tau) {
      p.mass_above += w;
      ++p.above;
    } else if (w == tau) {
      ++p.ties;
      p.from = min(p.from, key);
      p.to = max(p.to, key);
    }
  }
  p.mass_above = block_reduce(p.mass_above, sh.sums, Sum{}, 0.0);
  p.above = block_reduce(p.above, sh.counts, Sum{}, std::int64_t{0});
  p.ties = block_reduce(p.ties, sh.counts, Sum{}, std::int64_t{0});
  p.from = block_reduce(p.from, sh.keys, Min{}, 0xFFFFFFFFU);
  p.to = block_reduce(p.to, sh.keys, Max{}, 0U);
  return p;
}

// The top-k step: the k largest weights, ties by lower id.
__device__ KeptRange top_k(const RowView& r, std::int64_t k, std::uint32_t top_key,
                           DrawScratch& sh) {
  // The largest key K with at least k keys >= K: the k-th largest logit. lo always qualifies
  // (0: every candidate), hi never (above the largest).
  std::uint64_t lo = 0;
  std::uint64_t hi = std::uint64_t{top_key} + 1;
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    std::int64_t count = 0;
    for (std::int64_t j = threadIdx.x; j < r.candidates; j += blockDim.x)
      count += order_key(r.z[j]) >= mid ? 1 : 0;
    count = block_reduce(count, sh.counts, Sum{}, std::int64_t{0});
    if (count >= k) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const double tau = r.weight(key_value(static_cast<std::uint32_t>(lo)));
  const KeptRange all{.ids = r.candidates};
  const Plateau p = plateau(r, all, tau, sh);
  return {.from = p.from,
          .above = p.to,
          .ids = tie_cutoff(r, all, p.from, p.to, k - p.above, p.ties, sh.counts)};
}

// The top-p step among the ids `prior` keeps: the smallest set of the largest weights reaching
// top_p of their total, ties by lower id, at least one.
__device__ KeptRange top_p(const RowView& r, const KeptRange& prior, double fraction,
                           std::uint32_t top_key, DrawScratch& sh) {
  double total = 0.0;
  std::uint32_t lowest = 0xFFFFFFFFU;
  for (std::int64_t j = threadIdx.x; j < r.candidates; j += blockDim.x) {
    const float x = r.z[j];
    const std::uint32_t key = order_key(x);
    if (!prior.keeps(key, j)) continue;
    total += r.weight(x);
    lowest = min(lowest, key);
  }
  total = block_reduce(total, sh.sums, Sum{}, 0.0);
  lowest = block_reduce(lowest, sh.keys, Min{}, 0xFFFFFFFFU);
  const double target = fraction * total;
  // The largest key K whose kept mass at keys >= K reaches the target: the nucleus's smallest
  // logit. lo (the smallest kept key, a present one) is taken to qualify: all kept.
  std::uint64_t lo = lowest;
  std::uint64_t hi = std::uint64_t{top_key} + 1;
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    double mass = 0.0;
    for (std::int64_t j = threadIdx.x; j < r.candidates; j += blockDim.x) {
      const float x = r.z[j];
      const std::uint32_t key = order_key(x);
      if (key >= mid && prior.keeps(key, j)) mass += r.weight(x);
    }
    mass = block_reduce(mass, sh.sums, Sum{}, 0.0);
    if (mass >= target) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const double tau = r.weight(key_value(static_cast<std::uint32_t>(lo)));
  const Plateau p = plateau(r, prior, tau, sh);
  // The CPU adds the ties one at a time, lower id first, while nothing is kept yet or the mass
  // is short of the target: n ties, n * tau the mass they add.
  std::int64_t needed = p.above == 0 ? 1 : 0;
  if (p.mass_above < target) {
    const double short_by = tau > 0.0 ? ceil((target - p.mass_above) / tau) : INFINITY;
    needed = max(needed, static_cast<std::int64_t>(fmin(short_by, static_cast<double>(p.ties))));
  }
  return {.from = p.from,
          .above = p.to,
          .ids = tie_cutoff(r, prior, p.from, p.to, needed, p.ties, sh.counts)};
}

// One block of kDrawThreads per row (temperature > 0): the kept set, then the draw with
// uniforms[row]; the token's log-probability from the statistics of row_stats_kernel.
__global__ void __launch_bounds__(kDrawThreads)
    draw_kernel(std::int32_t* tokens, float* logprobs, const float* stats, const std::int32_t* best,
                const float* logits, const double* uniforms, std::int64_t vocab,
                std::int64_t candidates, SamplingRule rule) {
  __shared__ DrawScratch sh;
  const std::int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  const float top = z[best[row]];
  const RowView r{.z = z,
                  .candidates = candidates,
                  .max = static_cast<double>(top),
                  .temperature = rule.temperature};
  const std::uint32_t top_key = order_key(top);

  KeptRange by_k{.ids = candidates};
  if (rule.top_k > 0 && rule.top_k < candidates) by_k = top_k(r, rule.top_k, top_key, sh);
  KeptRange by_p{.ids = candidates};
  if (rule.top_p < 1.0) by_p = top_p(r, by_k, rule.top_p, top_key, sh);
  const auto kept = [&](float x, std::int64_t j) {
    const std::uint32_t key = order_key(x);
    return by_k.keeps(key, j) && by_p.keeps(key, j);
  };

  // Thread t walks ids [t * chunk, (t + 1) * chunk): its kept weight, then the scan of those
  // over the block (Hillis-Steele in shared memory) gives its running start.
  const std::int64_t chunk = (candidates + blockDim.x - 1) / blockDim.x;
  const std::int64_t first = threadIdx.x * chunk;
  const std::int64_t last = min(candidates, first + chunk);
  double own = 0.0;
  for (std::int64_t j = first; j < last; ++j) {
    if (kept(z[j], j)) own += r.weight(z[j]);
  }
  sh.scan[threadIdx.x] = own;
  __syncthreads();
  for (int offset = 1; offset < static_cast<int>(blockDim.x); offset *= 2) {
    const double add =
        static_cast<int>(threadIdx.x) >= offset ? sh.scan[threadIdx.x - offset] : 0.0;
    __syncthreads();
    sh.scan[threadIdx.x] += add;
    __syncthreads();
  }
  const double total = sh.scan[blockDim.x - 1];
  const double threshold = uniforms[row] * total;
  double running = threadIdx.x > 0 ? sh.scan[threadIdx.x - 1] : 0.0;
  std::int64_t found = kNoId;
  std::int64_t last_weighted = -1;  // the fallback: the last kept id with weight
  for (std::int64_t j = first; j < last; ++j) {
    if (!kept(z[j], j)) continue;
    const double w = r.weight(z[j]);
    if (w <= 0.0) continue;
    last_weighted = j;
    running += w;
    if (threshold < running) {
      found = j;
      break;
    }
  }
  found = block_reduce(found, sh.counts, Min{}, kNoId);
  if (found == kNoId) {
    // Rounding left u * total at or above the last running sum: the last kept id with weight
    // (the largest logit always has weight 1).
    found = block_reduce(last_weighted, sh.counts, Max{}, std::int64_t{-1});
  }
  if (threadIdx.x != 0) return;
  const auto token = static_cast<std::int32_t>(found);
  tokens[row] = token;
  if (logprobs != nullptr)
    logprobs[row] =
        token_logprob(stats[row * 2], stats[row * 2 + 1], __fmul_rn(rule.logprob_scale, z[token]));
}

}  // namespace

std::size_t sample_tokens_workspace(std::int64_t rows) {
  return align256(static_cast<std::size_t>(rows) * 2 * sizeof(float)) +
         static_cast<std::size_t>(rows) * sizeof(std::int32_t);
}

void sample_tokens(std::int32_t* tokens, float* logprobs, const float* logits,
                   const double* uniforms, std::int64_t rows, std::int64_t vocab,
                   std::int64_t candidates, const SamplingRule& rule, void* workspace,
                   cudaStream_t stream) {
  if (rows == 0) return;
  const bool greedy = rule.temperature == 0.0;
  auto* stats = static_cast<float*>(workspace);
  auto* best = reinterpret_cast<std::int32_t*>(
      static_cast<char*>(workspace) + align256(static_cast<std::size_t>(rows) * 2 * sizeof(float)));
  row_stats_kernel<<<static_cast<unsigned int>(rows), kStatsThreads, 0, stream>>>(
      tokens, logprobs, stats, best, logits, vocab, candidates, greedy, rule.logprob_scale);
  check_launch("sample tokens: row statistics");
  if (greedy) return;
  draw_kernel<<<static_cast<unsigned int>(rows), kDrawThreads, 0, stream>>>(
      tokens, logprobs, stats, best, logits, uniforms, vocab, candidates, rule);
  check_launch("sample tokens: draw");
}

}  // namespace l3::cuda
