// The backend interface the Llama model is written against (once): the CPU reference backend
// (fp32, OpenMP, OpenBLAS) and the CUDA backend (bf16 activations, fp32 accumulation)
// implement it. Every tensor is a flat row-major array; shapes are given in the comments as
// (rows, cols) with N = tokens of the micro-batch, H = hidden, V = vocabulary.
//
// Gradient conventions: parameter gradients (dw) are always accumulated (+=), so that
// micro-batches add up; activation gradients are overwritten unless the op says "+=".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kernels/tensor.hpp"

namespace l3::kernels {

// Packed rows: the N tokens of a micro-batch are cut into segments (documents, or padding) by
// cu_seqlens (i32, n_segments + 1, cu_seqlens[0] = 0, cu_seqlens[n_segments] = N). A token
// attends to the tokens of its own segment up to itself, and to nothing else.
struct AttentionShape {
  std::int64_t tokens = 0;  // N
  int n_heads = 0;
  int n_kv_heads = 0;  // n_heads % n_kv_heads == 0 (GQA); K/V are never replicated in memory
  int head_dim = 0;
  int n_segments = 0;
  int max_segment = 0;  // longest segment, for workspace sizing
  // The same cu_seqlens in host memory, when the caller has them: a backend that plans its work
  // per segment on the host (the CUDA fallback) then needs no download and no stream
  // synchronisation per call. Empty: read the device copy.
  std::span<const std::int32_t> host_cu_seqlens{};
};

// The summed cross-entropy of the counted tokens and how many there were.
struct LossSum {
  double loss = 0.0;
  std::int64_t tokens = 0;
};

// One host array to copy into backend memory (same dtype and length).
struct HostUpload {
  TensorView dst;  // backend memory
  TensorView src;  // host memory, free for reuse once upload_inputs returns
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

// Where a run computes: the CPU reference (fp32, host memory) or CUDA (bf16, device memory);
// `automatic` (a choice, never an Ops' own) is CUDA when compiled in and a device is visible.
enum class Backend : std::uint8_t { automatic, cpu, cuda };

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
  virtual void zero(TensorView x) = 0;
  // dst = src (same numel; converts between f32 and bf16). Host <-> backend memory included:
  // on the CPU backend both sides are host memory.
  virtual void copy(TensorView dst, TensorView src) = 0;
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

  // ---- linear layers: y = x W^T, W stored [out, in] as in Hugging Face --------------------
  // y (M, N) = x (M, K) W^T, W (N, K); y += ... when accumulate
  virtual void matmul(TensorView y, TensorView x, TensorView w, std::int64_t m, std::int64_t n,
                      std::int64_t k, bool accumulate) = 0;
  // dx (M, K) = dy (M, N) W (+= when accumulate_dx; skipped when dx is empty);
  // dw (N, K) += dy^T x (skipped when dw is empty)
  virtual void matmul_backward(TensorView dx, TensorView dw, TensorView dy, TensorView x,
                               TensorView w, std::int64_t m, std::int64_t n, std::int64_t k,
                               bool accumulate_dx) = 0;

  // ---- embedding: out (N, H) = table[tokens] ----------------------------------------------
  virtual void embedding(TensorView out, TensorView tokens, TensorView table, std::int64_t n,
                         std::int64_t hidden) = 0;
  // dtable (V, H) += scatter of dout (N, H) by tokens (deterministic order)
  virtual void embedding_backward(TensorView dtable, TensorView tokens, TensorView dout,
                                  std::int64_t n, std::int64_t hidden) = 0;

  // ---- RMSNorm: out = x * rsqrt(mean(x^2) + eps) * w, statistics in fp32 -------------------
  // x, out (rows, H); w (H); rstd (rows) f32, saved for the backward
  virtual void rmsnorm(TensorView out, TensorView rstd, TensorView x, TensorView w,
                       std::int64_t rows, std::int64_t hidden, float eps) = 0;
  // dx (rows, H) += d/dx; dw (H) += d/dw
  virtual void rmsnorm_backward(TensorView dx, TensorView dw, TensorView dout, TensorView x,
                                TensorView w, TensorView rstd, std::int64_t rows,
                                std::int64_t hidden) = 0;

  // ---- RoPE, Hugging Face rotate-half convention (pair i with i + head_dim/2), in place ----
  // x (N, heads, head_dim); positions (N) i32; cos, sin (max_position, head_dim/2) f32
  virtual void rope(TensorView x, TensorView positions, TensorView cos, TensorView sin,
                    std::int64_t n, int heads, int head_dim) = 0;
  // The inverse rotation applied to the gradient, in place.
  virtual void rope_backward(TensorView dx, TensorView positions, TensorView cos, TensorView sin,
                             std::int64_t n, int heads, int head_dim) = 0;

  // ---- causal GQA attention over packed segments, softmax scale 1/sqrt(head_dim) -----------
  // q, out (N, n_heads, head_dim); k, v (N, n_kv_heads, head_dim);
  // lse (n_heads, N) f32: log-sum-exp of each query's scaled scores, saved for the backward
  virtual void attention(TensorView out, TensorView lse, TensorView q, TensorView k, TensorView v,
                         TensorView cu_seqlens, const AttentionShape& shape) = 0;
  // dq (N, n_heads, head_dim), dk, dv (N, n_kv_heads, head_dim): overwritten
  virtual void attention_backward(TensorView dq, TensorView dk, TensorView dv, TensorView dout,
                                  TensorView out, TensorView lse, TensorView q, TensorView k,
                                  TensorView v, TensorView cu_seqlens,
                                  const AttentionShape& shape) = 0;

  // ---- SwiGLU: out = silu(gate) * up, elementwise over n values ---------------------------
  virtual void swiglu(TensorView out, TensorView gate, TensorView up, std::int64_t n) = 0;
  virtual void swiglu_backward(TensorView dgate, TensorView dup, TensorView dout, TensorView gate,
                               TensorView up, std::int64_t n) = 0;

  // ---- reductions ------------------------------------------------------------------------
  // dst += src over n values, src in the compute dtype, dst in it or in f32; each sum taken in
  // fp32 and rounded once to dst's dtype (ZeRO-2: a micro-batch's reduced gradients added into
  // the optimizer's f32 piece).
  virtual void add_into(TensorView dst, TensorView src, std::int64_t n) = 0;
  // sum of x^2 in double precision (gradient norms)
  [[nodiscard]] virtual double sum_squares(TensorView x, std::int64_t n) = 0;
  // out[i] = sum_squares(xs[i], xs[i].numel()), the same values; a backend with a queue
  // returns them all with one synchronisation instead of one each.
  virtual void sum_squares_each(std::span<const TensorView> xs, std::span<double> out) = 0;

  // ---- lm_head + cross-entropy, fused and chunked over tokens -------------------------------
  // h (N, H), w (V, H). rows (C) i32: the positions whose loss counts (ascending), targets (C)
  // i32: the token each of them predicts; C = counted, known to the caller (it built the mask),
  // so that the backend sizes its work without reading anything back. Adds the summed CE of
  // the C rows to loss_sum (1) f64 in backend memory: the caller reads it when it needs the
  // value, and a backend with a queue does not wait here. Logits are built a block of tokens
  // at a time, never for the whole batch. With dh non-empty, also dh (N, H) =
  // grad_scale * d(sum CE)/dh (overwritten; uncounted rows 0) and dw (V, H) += grad_scale * d/dw.
  virtual void lm_head_cross_entropy(TensorView loss_sum, TensorView dh, TensorView dw,
                                     TensorView h, TensorView w, TensorView rows,
                                     TensorView targets, std::int64_t n, std::int64_t counted,
                                     std::int64_t vocab, std::int64_t hidden, float grad_scale) = 0;

  // ---- reward head: scores (P) f32 = h[rows[p]] . w, w (H) --------------------------------
  virtual void gather_dot(TensorView scores, TensorView h, TensorView w, TensorView rows,
                          std::int64_t count, std::int64_t hidden) = 0;
  // dh[rows[p]] += dscores[p] * w (dh (N, H) is overwritten elsewhere with zeros first);
  // dw += sum_p dscores[p] * h[rows[p]]
  virtual void gather_dot_backward(TensorView dh, TensorView dw, TensorView dscores, TensorView h,
                                   TensorView w, TensorView rows, std::int64_t count,
                                   std::int64_t hidden) = 0;

  // ---- Bradley-Terry loss on P preference pairs (the reward model's) -----------------------
  // scores (2P) f32: the chosen rows' scores, then the rejected rows'; margins (P) f32, or
  // empty for none. loss_p = softplus(-(c - r - margin_p)) + center * (c + r)^2, in fp64.
  // Adds {sum of loss_p, pairs with c > r, sum of c - r} to sums (3) f64 in backend memory
  // (read when needed, as lm_head_cross_entropy's loss_sum); with d_scores (2P) f32 non-empty,
  // d_scores = grad_scale * d loss / d scores.
  virtual void bradley_terry(TensorView sums, TensorView d_scores, TensorView scores,
                             TensorView margins, std::int64_t pairs, double center,
                             float grad_scale) = 0;

  // ---- optimizer -------------------------------------------------------------------------
  // PyTorch's AdamW on n elements: p *= 1 - lr*wd; m, v updated with g*grad_scale;
  // p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). params (the master weights), m, v
  // f32; grads in the compute dtype or f32. params_copy (the weights the matmuls read, when they
  // are not the master weights themselves) receives the updated params rounded to its dtype, or is
  // empty.
  virtual void adamw(TensorView params, TensorView params_copy, TensorView grads, TensorView m,
                     TensorView v, std::int64_t n, const AdamWParams& hyper) = 0;
};

}  // namespace l3::kernels
