// Launchers of the CUDA backend's own kernels (the .cu files of kernels/cuda), callable from
// host C++ (no CUDA types in this header). All run asynchronously on `stream`.
// bf16 arrays are passed as kernels::BFloat16; f32 accumulators and statistics as float.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/ops.hpp"
#include "kernels/tensor.hpp"

namespace l3::cuda {

using kernels::BFloat16;

// casts.cu
void cast_f32_to_bf16(BFloat16* out, const float* in, std::int64_t n, cudaStream_t stream);
void cast_bf16_to_f32(float* out, const BFloat16* in, std::int64_t n, cudaStream_t stream);
void fill_bf16(BFloat16* out, float value, std::int64_t n, cudaStream_t stream);

// embedding.cu: out (N, H) = table[tokens]; tokens outside [0, V) give zero rows
void embedding_forward(BFloat16* out, const std::int32_t* tokens, const BFloat16* table,
                       std::int64_t n, std::int64_t hidden, std::int64_t vocab,
                       cudaStream_t stream);
// dtable (V, H) += dout rows grouped by token (a stable sort of the tokens first), each group
// summed in a fixed order, segment by segment of 64 sorted positions: deterministic, and a token
// repeated at many positions is summed in parallel. `workspace` is from
// embedding_backward_workspace.
std::size_t embedding_backward_workspace(std::int64_t n, std::int64_t hidden);
// dtable bf16, or fp32 (--grad-accum-dtype fp32); likewise the other weight gradients below.
void embedding_backward(BFloat16* dtable, const std::int32_t* tokens, const BFloat16* dout,
                        std::int64_t n, std::int64_t hidden, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t stream);
void embedding_backward(float* dtable, const std::int32_t* tokens, const BFloat16* dout,
                        std::int64_t n, std::int64_t hidden, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t stream);

// rmsnorm.cu: out = (x * rstd) * w, rstd in fp32
void rmsnorm_forward(BFloat16* out, float* rstd, const BFloat16* x, const BFloat16* w,
                     std::int64_t rows, std::int64_t hidden, float eps, cudaStream_t stream);
// dx += d/dx (bf16, read-modify-write); dw += d/dw through fp32 partial sums per row chunk,
// combined in order (deterministic); dw null: none (a frozen norm). partials:
// rmsnorm_partials(rows, hidden) floats.
std::int64_t rmsnorm_partials(std::int64_t rows, std::int64_t hidden);
void rmsnorm_backward(BFloat16* dx, BFloat16* dw, const BFloat16* dout, const BFloat16* x,
                      const BFloat16* w, const float* rstd, std::int64_t rows, std::int64_t hidden,
                      float* partials, cudaStream_t stream);
void rmsnorm_backward(BFloat16* dx, float* dw, const BFloat16* dout, const BFloat16* x,
                      const BFloat16* w, const float* rstd, std::int64_t rows, std::int64_t hidden,
                      float* partials, cudaStream_t stream);

// rope.cu: in place on x (N, heads, head_dim); sign +1 forward, -1 its transpose
void rope(BFloat16* x, const std::int32_t* positions, const float* cos, const float* sin,
          std::int64_t n, int heads, int head_dim, float sign, cudaStream_t stream);

// dropout.cu: out = x * scale * keep_i / (1 - p), the mask of kernels/dropout_mask.hpp; out may
// be x
void dropout(BFloat16* out, const BFloat16* x, std::int64_t n, float p, float scale,
             std::uint64_t seed, cudaStream_t stream);

// swiglu.cu
void swiglu_forward(BFloat16* out, const BFloat16* gate, const BFloat16* up, std::int64_t n,
                    cudaStream_t stream);
void swiglu_backward(BFloat16* dgate, BFloat16* dup, const BFloat16* dout, const BFloat16* gate,
                     const BFloat16* up, std::int64_t n, cudaStream_t stream);

// accumulate.cu: dst += src, fp32 sums rounded once (to bf16, or kept in an fp32 dst)
void add_into(BFloat16* dst, const BFloat16* src, std::int64_t n, cudaStream_t stream);
void add_into(float* dst, const BFloat16* src, std::int64_t n, cudaStream_t stream);

// reductions.cu: sum of squares in fp64, fixed order. partials: kSumSquaresBlocks doubles.
inline constexpr int kSumSquaresBlocks = 1024;
void sum_squares(double* result, const BFloat16* x, std::int64_t n, double* partials,
                 cudaStream_t stream);
void sum_squares_f32(double* result, const float* x, std::int64_t n, double* partials,
                     cudaStream_t stream);

// cross_entropy.cu (the GEMMs of the fused lm_head run on cuBLASLt, these are the row parts)
// Gathers rows[i] of h (N, H) into out (count, H) and back.
void gather_rows(BFloat16* out, const BFloat16* h, const std::int32_t* rows, std::int64_t count,
                 std::int64_t hidden, cudaStream_t stream);
void scatter_rows(BFloat16* h, const BFloat16* in, const std::int32_t* rows, std::int64_t count,
                  std::int64_t hidden, cudaStream_t stream);
// Per row of logits (rows, V) fp32: loss[r] = logsumexp - logit[target[r]]; with dlogits
// non-null, dlogits = grad_scale * row_scale[r] * (softmax - onehot) in bf16 (row_scale may be
// null: 1); with entropy non-null, entropy[r] = logsumexp - sum_v softmax_v logit_v (nats).
void softmax_cross_entropy(float* loss, BFloat16* dlogits, const float* logits,
                           const std::int32_t* targets, const float* row_scale, std::int64_t rows,
                           std::int64_t vocab, float grad_scale, cudaStream_t stream,
                           float* entropy = nullptr);
// *result += the sum of n floats (fp64, fixed order): the loss stays on the device
void add_sum_f32(double* result, const float* x, std::int64_t n, cudaStream_t stream);

// attention_fallback.cu, for one segment of length L and a batch of `heads` score matrices
// (the heads of one GQA group offset): scores (heads, L, L) fp32 already scaled; probs
// (heads, L, L) bf16; the statistics of batch entry h, row i at lse[h * lse_stride + i]
void causal_softmax(BFloat16* probs, float* lse, const float* scores, int heads,
                    std::int64_t length, std::int64_t lse_stride, cudaStream_t stream);
// probs = exp(scores - lse) below the diagonal, 0 above (the backward's recomputation)
void causal_probs(BFloat16* probs, const float* scores, const float* lse, int heads,
                  std::int64_t length, std::int64_t lse_stride, cudaStream_t stream);
// D[h * L + i] = sum_d dout[i, h, d] * out[i, h, d] over all heads of the segment's rows
void attention_row_dot(float* dot, const BFloat16* dout, const BFloat16* out, int heads,
                       std::int64_t length, int head_dim, cudaStream_t stream);
// dscores = scale * probs * (dprobs - dot[h * dot_stride + i]), bf16
void attention_dscores(BFloat16* dscores, const BFloat16* probs, const float* dprobs,
                       const float* dot, std::int64_t dot_stride, int heads, std::int64_t length,
                       float scale, cudaStream_t stream);

// decode_attention.cu: generation's KV cache (kernels::KvCacheWriteArgs, DecodeAttentionArgs).
// A layer's caches (slots, capacity, n_kv_heads, head_dim) bf16; rows (n) of i32 slots and
// positions on the device. Rows outside the cache (a slot or position out of range) are skipped:
// nothing written into the cache, zeros as their attention output (the CPU backend throws).
struct CacheGeometry {
  std::int64_t rows = 0;
  std::int64_t slots = 0, capacity = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
};
// k_cache[slots[i], positions[i]] = k[i] and likewise v; k, v (rows, n_kv_heads, head_dim)
void kv_cache_write(BFloat16* k_cache, BFloat16* v_cache, const BFloat16* k, const BFloat16* v,
                    const std::int32_t* slots, const std::int32_t* positions,
                    const CacheGeometry& g, cudaStream_t stream);
// rope.cu: rope(q), rope(k) forward and kv_cache_write(k, v) in one launch (decoding), the same
// bits; q (rows, q_heads, head_dim), k and v (rows, n_kv_heads, head_dim) as g says.
void rope_kv_cache_write(BFloat16* q, BFloat16* k, const BFloat16* v, BFloat16* k_cache,
                         BFloat16* v_cache, const std::int32_t* slots,
                         const std::int32_t* positions, const float* cos, const float* sin,
                         int q_heads, const CacheGeometry& g, cudaStream_t stream);
// How the keys of each row are split over blocks (flash-decoding) for rows whose longest has
// max_keys keys: split s takes keys [s * split_keys, (s + 1) * split_keys), the last one all the
// rest; with splits > 1 the partial results take workspace_bytes of device memory.
struct DecodePlan {
  int splits = 1;
  std::int64_t split_keys = 0;
  std::size_t workspace_bytes = 0;
};
[[nodiscard]] DecodePlan plan_decode_attention(const CacheGeometry& g, int max_keys);
// out, q (rows, n_heads, head_dim): row i's heads against positions 0..positions[i] of slot
// slots[i], softmax and accumulation in fp32; workspace: the plan's bytes (null when none).
void decode_attention(BFloat16* out, const BFloat16* q, const BFloat16* k_cache,
                      const BFloat16* v_cache, const std::int32_t* slots,
                      const std::int32_t* positions, const CacheGeometry& g, const DecodePlan& plan,
                      void* workspace, cudaStream_t stream);

// sampling.cu: the next token of each row of logits (rows, vocab) f32 among the first
// `candidates` ids, by kernels::SampleTokensArgs's rule (temperature 0: greedy); tokens (rows)
// i32; logprobs (rows) f32 or null: log p(token) over all `vocab` logits, computed as
// softmax_cross_entropy computes a row's loss; uniforms (rows) f64 in [0, 1). workspace:
// sample_tokens_workspace(rows) bytes.
struct SamplingRule {
  double temperature = 0.0;
  double top_p = 1.0;
  std::int64_t top_k = 0;      // 0: no limit
  float logprob_scale = 1.0F;  // the log-probabilities are of softmax(logprob_scale * logits)
};
[[nodiscard]] std::size_t sample_tokens_workspace(std::int64_t rows);
void sample_tokens(std::int32_t* tokens, float* logprobs, const float* logits,
                   const double* uniforms, std::int64_t rows, std::int64_t vocab,
                   std::int64_t candidates, const SamplingRule& rule, void* workspace,
                   cudaStream_t stream);

// reward_head.cu
void gather_dot(float* scores, const BFloat16* h, const BFloat16* w, const std::int32_t* rows,
                std::int64_t count, std::int64_t hidden, cudaStream_t stream);
void gather_dot_backward(BFloat16* dh, BFloat16* dw, const float* dscores, const BFloat16* h,
                         const BFloat16* w, const std::int32_t* rows, std::int64_t count,
                         std::int64_t hidden, cudaStream_t stream);
void gather_dot_backward(BFloat16* dh, float* dw, const float* dscores, const BFloat16* h,
                         const BFloat16* w, const std::int32_t* rows, std::int64_t count,
                         std::int64_t hidden, cudaStream_t stream);
// Bradley-Terry over P pairs (scores: chosen then rejected; margins may be null): sums[0..2] +=
// {loss, pairs with chosen > rejected, chosen - rejected}; d_scores (may be null) = grad_scale *
// d loss / d score. fp64, one block, a fixed summation order.
void bradley_terry(double* sums, float* d_scores, const float* scores, const float* margins,
                   std::int64_t pairs, double center, float grad_scale, cudaStream_t stream);

// dpo_loss.cu. ranges (S, 2) i32: {begin, end} of each sequence in the C counted rows (clipped
// to [0, C) on the device: nothing outside is read or written; the CPU backend throws instead).
// logps[s] = -(sum of row_loss over ranges[s]) in fp64, in row order (one thread a sequence),
// divided by the row count when `mean` (0 for an empty range).
void sequence_log_probs(double* logps, const float* row_loss, std::int64_t rows,
                        const std::int32_t* ranges, std::int64_t sequences, bool mean,
                        cudaStream_t stream);
// DPO over P pairs (ranges: the chosen sequences, then the rejected; reference (2P) f64), as
// kernels::DpoLossArgs: sums[0..3] += {loss, pairs with chosen reward > rejected, sum of reward
// margins, sum of chosen rewards}; d_rows (C, may be null) = grad_scale * d loss / d row_loss, 0
// for rows of no sequence, written sequence after sequence in the CPU reference's order. fp64, one
// block, a fixed summation order.
void dpo_loss(double* sums, float* d_rows, const float* row_loss, std::int64_t rows,
              const std::int32_t* ranges, const double* reference, std::int64_t pairs, double beta,
              double label_smoothing, kernels::PreferenceLoss loss, float grad_scale,
              cudaStream_t stream);

// policy_loss.cu: GRPO's clipped surrogate over C counted rows, as kernels::PolicyLossArgs
// (old_logps, ref_row_loss, sampled_logps, row_entropy, completion_starts, largest and d_rows may
// be null): sums[0..4] += {loss, k3 KL, rows clipped low, rows clipped high, entropy}; largest[0]
// = max(largest[0], max |logp - sampled|); with importance sampling also sums[5..7] += {sum of
// rho, units, rejected rows}, largest[1..2] = max with {max rho, 1 / (1 + min rho)}; d_rows =
// grad_scale * d loss / d row_loss. fp64, one block, a fixed summation order.
struct PolicyLossRows {
  const float* row_loss = nullptr;
  const float* advantages = nullptr;
  const float* weights = nullptr;
  const float* old_logps = nullptr;
  const float* ref_row_loss = nullptr;
  const float* sampled_logps = nullptr;
  const float* row_entropy = nullptr;
  const std::int32_t* completion_starts = nullptr;  // (completions + 1): sequence_* modes
  std::int64_t completions = 0;
};
struct PolicyLossParams {
  double epsilon_low = 0.2;
  double epsilon_high = 0.2;
  double beta = 0.0;
  kernels::ImportanceSampling importance_sampling = kernels::ImportanceSampling::off;
  double clip_min = 0.0;
  double clip_max = 0.0;
  float grad_scale = 1.0F;
};
void policy_loss(double* sums, double* largest, float* d_rows, const PolicyLossRows& rows,
                 std::int64_t count, const PolicyLossParams& params, cudaStream_t stream);

// adamw.cu: master f32, grads bf16 or f32 (ZeRO-2's accumulated shard), moments f32, copy bf16
// (may be null)
void adamw(float* master, BFloat16* copy, const BFloat16* grads, float* m, float* v, std::int64_t n,
           const kernels::AdamWParams& hyper, cudaStream_t stream);
void adamw(float* master, BFloat16* copy, const float* grads, float* m, float* v, std::int64_t n,
           const kernels::AdamWParams& hyper, cudaStream_t stream);

}  // namespace l3::cuda
