// The sizes of each op, read from the shapes of its views and checked once for every backend:
// a view of the wrong shape is an internal error that names the op, the tensor, its shape and
// the one expected. The backends take their loop bounds from these, never from their callers.
// Element types are checked where the data is read (TensorView::as).
#pragma once

#include <cstdint>

#include "kernels/ops.hpp"

namespace l3::kernels {

struct MatmulDims {
  std::int64_t m = 0, n = 0, k = 0;  // y (M, N) = x (M, K) W^T, W (N, K)
};
[[nodiscard]] MatmulDims matmul_dims(const MatmulArgs& a);
[[nodiscard]] MatmulDims matmul_dims(const MatmulBackwardArgs& a);

struct RowDims {
  std::int64_t rows = 0, hidden = 0;  // (rows, H) activations
  std::int64_t vocab = 0;             // the embedding's table rows (embedding ops only)
};
[[nodiscard]] RowDims embedding_dims(const EmbeddingArgs& a);
[[nodiscard]] RowDims embedding_dims(const EmbeddingBackwardArgs& a);
[[nodiscard]] RowDims rmsnorm_dims(const RmsNormArgs& a);
[[nodiscard]] RowDims rmsnorm_dims(const RmsNormBackwardArgs& a);

struct RopeDims {
  std::int64_t tokens = 0;
  int heads = 0, head_dim = 0;
};
[[nodiscard]] RopeDims rope_dims(const RopeArgs& a);

// With shape.host_cu_seqlens = a.segments.host.
[[nodiscard]] AttentionShape attention_shape(const AttentionArgs& a);
[[nodiscard]] AttentionShape attention_shape(const AttentionBackwardArgs& a);

// The generation ops' sizes: n rows of n_heads query heads (decode_attention) or of n_kv_heads
// key/value heads (kv_cache_write) against a cache of (slots, capacity, n_kv_heads, head_dim).
struct KvCacheDims {
  std::int64_t rows = 0;
  int n_heads = 0;  // decode_attention only
  int n_kv_heads = 0, head_dim = 0;
  std::int64_t slots = 0, capacity = 0;
  int max_keys = 0;  // decode_attention only
};
[[nodiscard]] KvCacheDims kv_cache_write_dims(const KvCacheWriteArgs& a);
[[nodiscard]] KvCacheDims decode_attention_dims(const DecodeAttentionArgs& a);

struct SampleDims {
  std::int64_t rows = 0, vocab = 0;
  std::int64_t candidates = 0;  // the ids drawn from: vocab_limit, or all V
};
// Also checks the sampling parameters (internal Error: the caller validated the options).
[[nodiscard]] SampleDims sample_tokens_dims(const SampleTokensArgs& a);

// Elements of the elementwise ops.
[[nodiscard]] std::int64_t swiglu_size(const SwigluArgs& a);
[[nodiscard]] std::int64_t swiglu_size(const SwigluBackwardArgs& a);
[[nodiscard]] std::int64_t dropout_size(const DropoutArgs& a);  // p in [0, 1) checked too
[[nodiscard]] std::int64_t add_into_size(ConstTensorView dst, ConstTensorView src);
[[nodiscard]] std::int64_t adamw_size(const AdamWArgs& a);

struct LmHeadDims {
  std::int64_t n = 0, counted = 0, vocab = 0, hidden = 0;
};
[[nodiscard]] LmHeadDims lm_head_dims(const LmHeadCrossEntropyArgs& a);

struct GatherDims {
  std::int64_t count = 0, hidden = 0;
};
[[nodiscard]] GatherDims gather_dot_dims(const GatherDotArgs& a);
[[nodiscard]] GatherDims gather_dot_dims(const GatherDotBackwardArgs& a);

[[nodiscard]] std::int64_t bradley_terry_pairs(const BradleyTerryArgs& a);
// Sequences (S) of a sequence_log_probs call; pairs (P) of a dpo_loss call.
[[nodiscard]] std::int64_t sequence_count(const SequenceLogProbsArgs& a);
[[nodiscard]] std::int64_t dpo_pairs(const DpoLossArgs& a);
// Counted rows (C) of a policy_loss call: row_loss's, and every non-empty per-row view's.
[[nodiscard]] std::int64_t policy_rows(const PolicyLossArgs& a);

}  // namespace l3::kernels
