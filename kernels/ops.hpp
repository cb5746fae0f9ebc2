// The backend interface the Llama model is written against (once): the CPU reference backend
// (fp32, OpenMP, OpenBLAS) and the CUDA backend (bf16 activations, fp32 accumulation)
// implement it. Every tensor is a flat row-major array whose view carries its shape (tensor.hpp);
// the shapes in the comments use N = tokens of the micro-batch, H = hidden, V = vocabulary.
//
// Gradient conventions: parameter gradients (dw) are always accumulated (+=), so that
// micro-batches add up; activation gradients are overwritten unless the op says "+=".
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kernels/tensor.hpp"

namespace l3::kernels {

// Packed rows: the N tokens of a micro-batch are cut into segments (documents, or padding) by
// cu_seqlens (i32, n_segments + 1, cu_seqlens[0] = 0, cu_seqlens[n_segments] = N). A token
// attends to the tokens of its own segment up to itself, and to nothing else.
struct PackedSegments {
  ConstTensorView cu_seqlens;  // (n_segments + 1) i32, backend memory
  int max_segment = 0;         // longest segment, for workspace sizing
  // The same cu_seqlens in host memory, when the caller has them: a backend that plans its work
  // per segment on the host (the CUDA fallback) then needs no download and no stream
  // synchronisation per call. Empty: read the device copy.
  std::span<const std::int32_t> host{};
};

// An attention call's sizes, derived from its views by attention_shape (op_shapes.hpp) for the
// backends' own planning.
struct AttentionShape {
  std::int64_t tokens = 0;  // N, the keys
  int n_heads = 0;
  int n_kv_heads = 0;  // n_heads % n_kv_heads == 0 (GQA); K/V are never replicated in memory
  int head_dim = 0;
  int n_segments = 0;
  int max_segment = 0;
  std::span<const std::int32_t> host_cu_seqlens{};
  // Nq: N, or query_rows' length (last: positional initialisers of the fields above stay valid)
  std::int64_t queries = 0;
};

// The summed cross-entropy of the counted tokens and how many there were.
struct LossSum {
  double loss = 0.0;
  std::int64_t tokens = 0;
};

// One host array to copy into backend memory (same dtype and length).
struct HostUpload {
  TensorView dst;       // backend memory
  ConstTensorView src;  // host memory, free for reuse once upload_inputs returns
};

struct AdamWParams {
  float lr = 0.0F;
  float beta1 = 0.9F;
  float beta2 = 0.95F;
  float eps = 1e-8F;
  float weight_decay = 0.0F;  // 0 for tensors that are not decayed (norms)
  float grad_scale = 1.0F;    // gradients are multiplied by this first (clipping)
  std::int64_t step = 1;      // 1-based, for bias correction
};

// ---- each op's arguments: outputs first (TensorView), then inputs (ConstTensorView), then
// scalars. Shapes in the comments are the views' shapes, checked by the backend (op_shapes.hpp).

// ---- linear layers: y = x W^T, W stored [out, in] as in Hugging Face -----------------------
// y (M, N) = x (M, K) W^T, W (N, K); y += ... when accumulate. x and y are read as matrices of
// their rows: (M, heads, head_dim) is (M, heads * head_dim).
struct MatmulArgs {
  TensorView y;
  ConstTensorView x, w;
  bool accumulate = false;
  // Each row of y computed the same whatever the other rows of the call (generation: a
  // completion must not depend on the batch it ran in). The CPU backend then uses a kernel of
  // fixed arithmetic instead of SGEMM (cpu/matmul.hpp); CUDA ignores it (its completions agree
  // with the CPU's within bf16 tolerance, not bit for bit).
  bool row_invariant = false;
};
// dx (M, K) = dy (M, N) W (+= when accumulate_dx; skipped when dx is empty);
// dw (N, K) += dy^T x (skipped when dw is empty)
struct MatmulBackwardArgs {
  TensorView dx, dw;
  ConstTensorView dy, x, w;
  bool accumulate_dx = false;
};

// ---- vocabulary parallelism: a table of V rows holding some of the vocabulary's ids ---------
// Tensor parallelism splits the embedding and the lm_head by rows: rank r of T holds the ids
// [begin, begin + V) of a vocabulary of `whole` ids. whole 0: the table is the vocabulary.
// The CPU backend's only so far (a CUDA backend declines a slice).
struct VocabSlice {
  std::int64_t begin = 0;
  std::int64_t whole = 0;
  [[nodiscard]] bool sliced() const noexcept { return whole > 0; }
};

// ---- embedding: out (N, H) = table[tokens (N) i32], table (V, H) ----------------------------
// With a vocabulary slice, a token of another rank's ids gets a row of zeros (the group's sum
// is the embedding); a token outside the whole vocabulary is an error either way.
struct EmbeddingArgs {
  TensorView out;
  ConstTensorView tokens, table;
  VocabSlice vocab{};
};
// dtable (V, H) += scatter of dout (N, H) by tokens (deterministic order); tokens of another
// rank's ids add nothing.
struct EmbeddingBackwardArgs {
  TensorView dtable;
  ConstTensorView tokens, dout;
  VocabSlice vocab{};
};

// ---- RMSNorm: out = x * rsqrt(mean(x^2) + eps) * w, statistics in fp32 ---------------------
// x, out (rows, H); w (H); rstd (rows) f32, saved for the backward
struct RmsNormArgs {
  TensorView out, rstd;
  ConstTensorView x, w;
  float eps = 1e-5F;
};
// dx (rows, H) += d/dx; dw (H) += d/dw (skipped when dw is empty: a frozen norm, LoRA)
struct RmsNormBackwardArgs {
  TensorView dx, dw;
  ConstTensorView dout, x, w, rstd;
};

// ---- RoPE, Hugging Face rotate-half convention (pair i with i + head_dim/2), in place ------
// x (N, heads, head_dim); positions (N) i32; cos, sin (max_position, head_dim/2) f32
struct RopeArgs {
  TensorView x;
  ConstTensorView positions, cos, sin;
};

// ---- causal GQA attention over packed segments, softmax scale 1/sqrt(head_dim) -------------
// k, v (N, n_kv_heads, head_dim), the N tokens the segments cut. The queries are every token
// (query_rows empty: Nq = N), or (context parallelism) only some: query_rows (Nq) i32, strictly
// ascending, the token each query row is (a rank's chunks of the whole sequence, whose keys
// and values were gathered from every rank). q, out (Nq, n_heads, head_dim);
// lse (n_heads, Nq) f32: log-sum-exp of each query's scaled scores, saved for the backward.
// query_rows is read on the host: the CPU backend's only (a CUDA backend declines it).
struct AttentionArgs {
  TensorView out, lse;
  ConstTensorView q, k, v;
  PackedSegments segments;
  ConstTensorView query_rows{};
};
// dq (Nq, n_heads, head_dim), dk, dv (N, n_kv_heads, head_dim): overwritten; with query_rows,
// dk and dv hold the listed queries' share only (the other ranks' queries add theirs).
struct AttentionBackwardArgs {
  TensorView dq, dk, dv;
  ConstTensorView dout, out, lse, q, k, v;
  PackedSegments segments;
  ConstTensorView query_rows{};
};

// ---- generation: sequences in the slots of a KV cache, and attention against it ------------
// One layer's cache: k_cache, v_cache (slots, capacity, n_kv_heads, head_dim) in the compute
// dtype, a sequence per slot, its position p's keys and values at [slot, p].
// Row i of k, v (n, n_kv_heads, head_dim) is stored at [slots[i], positions[i]]; slots,
// positions (n) i32, each slot < slots and position < capacity, no two rows at one place.
struct KvCacheWriteArgs {
  TensorView k_cache, v_cache;
  ConstTensorView k, v, slots, positions;
};
// Decoding's fusion of rope(q), rope(k) (RopeArgs, at `positions`) and kv_cache_write(k, v):
// q (n, n_heads, head_dim) and k (n, n_kv_heads, head_dim) rotated in place, and the rotated k
// and v written into the cache rows of their slots and positions, in one pass over the rows
// (one launch instead of three). The same values as the three ops, bit for bit.
struct RopeKvCacheWriteArgs {
  TensorView q, k, k_cache, v_cache;
  ConstTensorView v, slots, positions, cos, sin;
};
// Row i's query heads q (n, n_heads, head_dim), after RoPE, attend to the cached positions
// 0 .. positions[i] of slot slots[i] (its own keys and values written already): causal GQA
// (query head h reads KV head h / (n_heads / n_kv_heads)), scale 1/sqrt(head_dim), softmax in
// fp32. out (n, n_heads, head_dim). Rows are independent: any mix of sequences and of positions
// within one (a chunk of a prompt continuing a cached prefix) in one call. max_keys: the
// largest positions[i] + 1 (workspace sizing); host_positions: the same positions on the host
// when the caller has them (empty: read the backend's).
struct DecodeAttentionArgs {
  TensorView out;
  ConstTensorView q, k_cache, v_cache, slots, positions;
  int max_keys = 0;
  std::span<const std::int32_t> host_positions{};
};

// ---- sampling: the next token of each row of logits, on the backend ------------------------
// Row i of logits (n, V) f32 restricted to ids below vocab_limit (0: all V), then:
//   temperature 0: the largest logit (the lowest id on ties);
//   else weights w_j = exp((l_j - max) / temperature); top_k > 0 keeps the k largest (ties by
//   lower id); top_p < 1 then keeps the smallest set of the largest whose weights reach top_p
//   of the kept total (ties by lower id; at least one); the draw walks the kept ids in
//   ascending order and returns the first whose running weight exceeds uniforms[i] x their
//   total (uniforms (n) f64 in [0, 1)).
// tokens (n) i32 receives the draws; logprobs (n) f32 log p(token) = z_token - logsumexp(z) over
// the whole row (all V, before top-k and top-p) with z = logprob_scale * logits (1: the raw
// logits; logit_scale(T): the distribution the temperature-T draw is made from, TRL's GRPO),
// computed as lm_head_cross_entropy computes its row losses with the same logit_scale (so that
// a generated token's log-probability is the training forward's); empty: not computed.
struct SampleTokensArgs {
  TensorView tokens, logprobs;
  ConstTensorView logits, uniforms;
  double temperature = 0.0;
  double top_p = 1.0;
  std::int64_t top_k = 0;
  std::int64_t vocab_limit = 0;
  float logprob_scale = 1.0F;
};

// The factor logits are multiplied by to be "divided by the temperature" (TRL's GRPO divides
// them before every log-probability): 1/T rounded once to f32, the one value the sampler's and
// the trainer's log-probabilities use; 1 for T = 0 (greedy) or T = 1.
[[nodiscard]] inline float logit_scale(double temperature) noexcept {
  return temperature > 0 ? static_cast<float>(1.0 / temperature) : 1.0F;
}

// ---- SwiGLU: out = silu(gate) * up, elementwise (all of one shape) --------------------------
struct SwigluArgs {
  TensorView out;
  ConstTensorView gate, up;
};
struct SwigluBackwardArgs {
  TensorView dgate, dup;
  ConstTensorView dout, gate, up;
};

// ---- scaled dropout (LoRA's adapters): out = x * scale * keep_i / (1 - p), elementwise ------
// keep_i = dropout_keep(seed, i, p) (kernels/dropout_mask.hpp): the same mask on every backend,
// a pure function of the seed and the element's index, so that a backward pass regenerates it
// instead of keeping it, and a rerun or a restart draws it again. p = 0: out = scale * x.
// out and x have one shape; out may be x itself.
struct DropoutArgs {
  TensorView out;
  ConstTensorView x;
  float p = 0.0F;  // [0, 1)
  float scale = 1.0F;
  std::uint64_t seed = 0;
};

// ---- lm_head + cross-entropy, fused and chunked over tokens ---------------------------------
// h (N, H), w (V, H). rows (C) i32: the positions whose loss counts (ascending), targets (C)
// i32: the token each of them predicts; C is known to the caller (it built the mask), so that
// the backend sizes its work without reading anything back. Adds the summed CE of the C rows
// to loss_sum (1) f64 in backend memory: the caller reads it when it needs the value, and a
// backend with a queue does not wait here. Logits are built a block of tokens at a time, never
// for the whole batch. With dh (N, H) non-empty, also dh = grad_scale * d(sum CE)/dh
// (overwritten; uncounted rows 0) and dw (V, H) += grad_scale * d/dw (skipped when dw is empty:
// a frozen lm_head, LoRA). loss_sum may be empty (nothing added). row_loss (C) f32, when
// non-empty, receives each counted row's CE; row_scale (C) f32, when non-empty, weighs each
// row's gradient (grad_scale * row_scale[c]): DPO's tokens count with their sequence's weight.
// row_entropy (C) f32, when non-empty, receives each counted row's entropy of softmax(logits) in
// nats, H = logsumexp(z) - sum_v softmax(z)_v z_v, from the same block of logits (forward only:
// no gradient flows through it; empty: not computed). The logits are z = logit_scale * h w^T
// (logit_scale(T): divided by a sampling temperature, as TRL's GRPO computes every
// log-probability and the entropy), and the gradients are those of that z.
//
// Vocabulary parallelism (`vocab` non-null): w holds the rows `vocab->slice` of the vocabulary,
// targets are whole ids, and every block's softmax spans the group's slices: each rank's
// statistics of its logits (kVocabStats f64 per row: max, sum of exp(z - max), sum of
// exp(z - max) (z - max), the target's logit or 0 where another rank holds it) are gathered
// with vocab->all_gather and combined in rank order, the same on every rank. Row losses, the
// loss sum and the entropies are then the whole vocabulary's on every rank; dw is this slice's
// gradient, and dh this slice's part of d/dh (the group's sum is the gradient).
inline constexpr std::int64_t kVocabStats = 4;
struct VocabShare {
  VocabSlice slice;
  int ranks = 1;
  // all (ranks x mine.size()) = every rank's `mine` in rank order. Collective over the group,
  // called once per block of rows (the same number of times on every rank).
  std::function<void(std::span<const double> mine, std::span<double> all)> all_gather;
};
struct LmHeadCrossEntropyArgs {
  TensorView loss_sum, dh, dw, row_loss, row_entropy;
  ConstTensorView h, w, rows, targets, row_scale;
  float grad_scale = 1.0F;
  float logit_scale = 1.0F;
  const VocabShare* vocab = nullptr;
};

// ---- reward head: scores (P) f32 = h[rows[p]] . w; h (N, H), w (H), rows (P) i32 ------------
struct GatherDotArgs {
  TensorView scores;
  ConstTensorView h, w, rows;
};
// dh[rows[p]] += dscores[p] * w (dh (N, H) is overwritten elsewhere with zeros first);
// dw += sum_p dscores[p] * h[rows[p]]
struct GatherDotBackwardArgs {
  TensorView dh, dw;
  ConstTensorView dscores, h, w, rows;
};

// ---- Bradley-Terry loss on P preference pairs (the reward model's) -------------------------
// scores (2P) f32: the chosen rows' scores, then the rejected rows'; margins (P) f32, or empty
// for none. loss_p = softplus(-(c - r - margin_p)) + center * (c + r)^2, in fp64. Adds {sum of
// loss_p, pairs with c > r, sum of c - r} to sums (3) f64 in backend memory (read when needed,
// as lm_head_cross_entropy's loss_sum); with d_scores (2P) f32 non-empty, d_scores =
// grad_scale * d loss / d scores.
struct BradleyTerryArgs {
  TensorView sums, d_scores;
  ConstTensorView scores, margins;
  double center = 0.0;
  float grad_scale = 1.0F;
};

// ---- sequences' log-probabilities and direct preference optimisation (DPO) ---------------
// row_loss (C) f32: the counted rows' cross-entropies (lm_head_cross_entropy's row_loss);
// ranges (S, 2) i32: each sequence's counted rows [begin, end) in that list. A sequence's
// log-probability is -(sum of its rows' losses), added in row order in fp64; `mean` divides it
// by its row count (IPO's per-token average).
struct SequenceLogProbsArgs {
  TensorView logps;  // (S) f64
  ConstTensorView row_loss, ranges;
  bool mean = false;
};

enum class PreferenceLoss : std::uint8_t { sigmoid, ipo };

// DPO on P pairs whose 2P sequences (ranges, as above) are the chosen ones, then the rejected
// ones; reference (2P) f64: the reference model's log-probabilities of the same sequences (as
// sequence_log_probs computes them). With l = the policy's (means for IPO),
//   rewards c_p = beta (l(chosen) - ref(chosen)), r_p = beta (l(rejected) - ref(rejected)),
//   h_p = (c_p - r_p) / beta,
//   sigmoid: loss_p = -(1 - eps) log sigmoid(beta h_p) - eps log sigmoid(-beta h_p)
//   ipo:     loss_p = (h_p - 1 / (2 beta))^2
// in fp64 (eps: label smoothing). Adds {sum of loss_p, pairs with c_p > r_p, sum of c_p - r_p,
// sum of c_p} to sums (4) f64 in backend memory; with d_rows (C) f32 non-empty, d_rows =
// grad_scale * d loss / d row_loss (0 for rows of no sequence): lm_head_cross_entropy's
// row_scale for the backward.
struct DpoLossArgs {
  TensorView sums, d_rows;
  ConstTensorView row_loss, ranges, reference;
  double beta = 0.1;
  double label_smoothing = 0.0;
  PreferenceLoss loss = PreferenceLoss::sigmoid;
  float grad_scale = 1.0F;
};

// ---- the clipped policy-gradient loss of GRPO and its variants (TRL's _compute_loss, token level)
// How the loss corrects for the generator's log-probabilities (sampled_logps) differing from the
// trainer's (TRL 1.10's vllm_importance_sampling_mode; off: vllm_importance_sampling_correction
// false). The ratio rho = exp(old - sampled), per token or per completion (the sum of its tokens'
// differences), is truncated into [clip_min, clip_max] or, masked, set to 0 outside it.
enum class ImportanceSampling : std::uint8_t {
  off,
  token_truncate,
  token_mask,
  sequence_truncate,
  sequence_mask
};
[[nodiscard]] constexpr bool is_sequence_level(ImportanceSampling mode) noexcept {
  return mode == ImportanceSampling::sequence_truncate || mode == ImportanceSampling::sequence_mask;
}
[[nodiscard]] constexpr bool is_masking(ImportanceSampling mode) noexcept {
  return mode == ImportanceSampling::token_mask || mode == ImportanceSampling::sequence_mask;
}

// Per counted row c of C (lm_head_cross_entropy's row_loss: logp_c = -row_loss[c]):
//   old_c = old_logps[c] (C f32), or logp_c itself when old_logps is empty (detached: ratio 1)
//   r_c = exp(logp_c - old_c); r'_c = clamp(r_c, 1 - epsilon_low, 1 + epsilon_high)
//   kl_c = exp(ref_c - logp_c) - (ref_c - logp_c) - 1   (k3; ref_c = -ref_row_loss[c]: the
//          reference model's cross-entropy of the row, C f32; 0 when ref_row_loss is empty)
//   low_c = r_c < 1 - epsilon_low and A_c < 0;  high_c = r_c > 1 + epsilon_high and A_c > 0
//   rho_c = 1 when importance_sampling is off; else, with s_c = sampled_logps[c] (C f32, needed),
//           token_*: raw_c = exp(old_c - s_c); sequence_*: raw_c = exp(sum over c's completion
//           of (old - s)), the completions given by completion_starts (S + 1) i32 (completion k
//           is rows [starts[k], starts[k+1]), starts[0] = 0, starts[S] = C); *_truncate: rho_c =
//           clamp(raw_c, clip_min, clip_max); *_mask: rho_c = raw_c, or 0 when raw_c < clip_min
//           or raw_c > clip_max (clip_min 0 / clip_max +inf: no bound). A constant: no gradient.
//   L_c = weights[c] * (-min(r_c A_c, r'_c A_c) rho_c + beta kl_c)  (advantages (C), weights (C)
//   f32)
// in fp64. Adds {sum L_c, sum kl_c, sum low_c, sum high_c, sum row_entropy[c]} to sums (5) f64
// (row_entropy (C) f32 may be empty: adds 0); with importance sampling, sums has 8 and also gets
// {sum of rho, units, rows whose raw_c was outside [clip_min, clip_max]}, over units = the
// completions (sequence_*: each one rho) or the rows (token_*). largest (1) f64 = max(largest,
// max_c |logp_c - sampled_logps[c]|) when sampled_logps (C f32) is non-empty (the generator's
// log-probabilities: how far the trainer's differ; largest may be empty without them); with
// importance sampling largest has 3 and also gets max(largest[1], max rho) and max(largest[2],
// 1 / (1 + min rho)) over the units (maxima that start at 0 and reduce over ranks with max; 0:
// no unit). With d_rows (C) f32 non-empty:
//   d_rows[c] = grad_scale * weights[c] * (A_c r_c rho_c [not low_c and not high_c]
//                                          - beta (1 - exp(ref_c - logp_c)))
// = grad_scale * dL_c/d row_loss[c]: lm_head_cross_entropy's row_scale for the backward.
struct PolicyLossArgs {
  TensorView sums, largest, d_rows;
  ConstTensorView row_loss, advantages, weights, old_logps, ref_row_loss, sampled_logps,
      row_entropy, completion_starts;
  double epsilon_low = 0.2, epsilon_high = 0.2, beta = 0.0;
  ImportanceSampling importance_sampling = ImportanceSampling::off;
  double clip_min = 0.0, clip_max = std::numeric_limits<double>::infinity();
  float grad_scale = 1.0F;
};

// ---- optimizer ---------------------------------------------------------------------------
// PyTorch's AdamW, elementwise over params, m, v, grads (the same number of elements):
// p *= 1 - lr*wd; m, v updated with g*grad_scale; p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t)
// + eps). params (the master weights), m, v f32; grads in the compute dtype or f32.
// params_copy (the weights the matmuls read, when they are not the master weights themselves)
// receives the updated params rounded to its dtype, or is empty.
struct AdamWArgs {
  TensorView params, params_copy, m, v;
  ConstTensorView grads;
  AdamWParams hyper;
};

// Where a run computes: the CPU reference (fp32, host memory) or CUDA (bf16, device memory);
// `automatic` (a choice, never an Ops' own) is CUDA when compiled in and a device is visible.
enum class Backend : std::uint8_t { automatic, cpu, cuda };

// A recorded sequence of a backend's ops (Ops::capture): a CUDA graph. Replaying it queues the
// same work on the same buffers (their contents at the time it runs, not at the recording), in
// order with the backend's other work, for one launch's host cost.
class OpsGraph {
 public:
  OpsGraph() = default;
  virtual ~OpsGraph() = default;
  OpsGraph(const OpsGraph&) = delete;
  OpsGraph& operator=(const OpsGraph&) = delete;
  OpsGraph(OpsGraph&&) = delete;
  OpsGraph& operator=(OpsGraph&&) = delete;
  virtual void replay() = 0;
  // false once the backend has replaced memory the recording uses (a grown scratch buffer):
  // record again rather than replay.
  [[nodiscard]] virtual bool valid() const noexcept = 0;
};

// Every member is pure: a backend, and a decorator such as ProfilingOps, states each one, so
// that one it forgets is a compile error rather than a silent default.
class Ops {
 public:
  Ops() = default;
  virtual ~Ops() = default;
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;
  Ops(Ops&&) = delete;
  Ops& operator=(Ops&&) = delete;

  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  [[nodiscard]] virtual Backend backend() const noexcept = 0;
  // What the backend did that a run's log should say (e.g. which attention ran how often);
  // empty when nothing.
  [[nodiscard]] virtual std::string report() const = 0;
  // The element type of activations and of the weights the matmuls read.
  [[nodiscard]] virtual DType compute_dtype() const noexcept = 0;
  // Makes the calling thread work on this backend's device (CUDA keeps the current device per
  // host thread), so that a host may drive a run from another thread than the one that made it.
  virtual void bind_thread() = 0;
  // Bytes of the memory the backend computes in (a GPU's), for the check that a run fits before
  // it allocates; 0 when that memory is the host's (core::host_memory_bytes() applies).
  [[nodiscard]] virtual std::int64_t memory_capacity() const = 0;

  // ---- memory ----------------------------------------------------------------------------
  // Zero-initialised.
  [[nodiscard]] virtual Buffer allocate(DType dtype, std::int64_t numel) = 0;
  // Bytes handed out by allocate() since construction (numel x element size, not counting
  // alignment padding or frees): what model::plan_training_memory is checked against, and what
  // the benchmarks report.
  [[nodiscard]] virtual std::int64_t allocated_bytes() const noexcept = 0;
  virtual void zero(TensorView x) = 0;
  // dst = src (same numel; converts between f32 and bf16). Host <-> backend memory included:
  // on the CPU backend both sides are host memory.
  virtual void copy(TensorView dst, ConstTensorView src) = 0;
  virtual void synchronize() = 0;
  // A micro-batch's inputs, host -> backend. The caller alternates its input buffers between
  // two sets (`set` 0 or 1) and passes every upload of one micro-batch in one call. A backend
  // with queues copies on its own copy queue, overlapping the work already queued: copies into
  // a set wait only for the work queued before the previous call (which used the other set),
  // and the work queued after this call waits for the copies. Without queues: plain copies.
  virtual void upload_inputs(int set, std::span<const HostUpload> uploads) = 0;
  // Milliseconds the backend's compute queue stood waiting for input uploads since the last
  // call (call it once the queued work is done, e.g. after synchronize()). 0 without queues:
  // plain copies happen before the work is queued.
  [[nodiscard]] virtual double take_input_wait_ms() = 0;

  // ---- the ops: each takes its own argument struct (above the class), outputs TensorView,
  // inputs ConstTensorView, every size read from the views' shapes and checked
  // (op_shapes.hpp); called with designated initializers: ops.matmul({.y = q, .x = x, .w = wq})
  virtual void matmul(const MatmulArgs& a) = 0;
  virtual void matmul_backward(const MatmulBackwardArgs& a) = 0;
  virtual void embedding(const EmbeddingArgs& a) = 0;
  virtual void embedding_backward(const EmbeddingBackwardArgs& a) = 0;
  virtual void rmsnorm(const RmsNormArgs& a) = 0;
  virtual void rmsnorm_backward(const RmsNormBackwardArgs& a) = 0;
  virtual void rope(const RopeArgs& a) = 0;
  // The inverse rotation, applied in place to a gradient (a.x).
  virtual void rope_backward(const RopeArgs& a) = 0;
  virtual void attention(const AttentionArgs& a) = 0;
  virtual void attention_backward(const AttentionBackwardArgs& a) = 0;
  virtual void kv_cache_write(const KvCacheWriteArgs& a) = 0;
  virtual void rope_kv_cache_write(const RopeKvCacheWriteArgs& a) = 0;
  virtual void decode_attention(const DecodeAttentionArgs& a) = 0;
  virtual void sample_tokens(const SampleTokensArgs& a) = 0;
  virtual void swiglu(const SwigluArgs& a) = 0;
  virtual void swiglu_backward(const SwigluBackwardArgs& a) = 0;
  virtual void dropout(const DropoutArgs& a) = 0;
  virtual void lm_head_cross_entropy(const LmHeadCrossEntropyArgs& a) = 0;
  virtual void gather_dot(const GatherDotArgs& a) = 0;
  virtual void gather_dot_backward(const GatherDotBackwardArgs& a) = 0;
  virtual void bradley_terry(const BradleyTerryArgs& a) = 0;
  virtual void sequence_log_probs(const SequenceLogProbsArgs& a) = 0;
  virtual void dpo_loss(const DpoLossArgs& a) = 0;
  virtual void policy_loss(const PolicyLossArgs& a) = 0;
  virtual void adamw(const AdamWArgs& a) = 0;

  // ---- reductions ------------------------------------------------------------------------
  // dst += src (the same number of elements), src in the compute dtype, dst in it or in f32;
  // each sum taken in fp32 and rounded once to dst's dtype (ZeRO-2: a micro-batch's reduced
  // gradients added into the optimizer's f32 piece).
  virtual void add_into(TensorView dst, ConstTensorView src) = 0;
  // sum of x^2 in double precision (gradient norms)
  [[nodiscard]] virtual double sum_squares(ConstTensorView x) = 0;
  // out[i] = sum_squares(xs[i]), the same values; a backend with a queue returns them all with
  // one synchronisation instead of one each.
  virtual void sum_squares_each(std::span<const ConstTensorView> xs, std::span<double> out) = 0;

  // ---- graphs ------------------------------------------------------------------------------
  // Whether capture() records (CUDA). Such a backend also skips, in kv_cache_write and
  // decode_attention, a row whose slot is outside the cache (-1): a pad row of a fixed-shape
  // pass writes and reads nothing there (the CPU backend throws instead).
  [[nodiscard]] virtual bool can_capture() const noexcept = 0;
  // Records the ops that `record` issues on this backend into a graph without running them.
  // Everything it issues must be capture-safe: no allocation, no synchronisation, no copy from
  // or to host memory, no host decision on device data (an internal Error names the call that
  // was not, and nothing is recorded). An internal Error where !can_capture().
  [[nodiscard]] virtual std::unique_ptr<OpsGraph> capture(const std::function<void()>& record) = 0;
};

// A zero-initialised buffer of `shape` on `ops`'s memory.
[[nodiscard]] inline Buffer allocate(Ops& ops, DType dtype, const Shape& shape) {
  Buffer buffer = ops.allocate(dtype, shape.numel());
  buffer.reshape(shape);
  return buffer;
}

}  // namespace l3::kernels
