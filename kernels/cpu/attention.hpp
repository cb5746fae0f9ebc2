// Causal grouped-query attention over packed segments, on SGEMM tiles.
//
// Each segment [cu_seqlens[s], cu_seqlens[s+1]) is an independent causal sequence (a document
// of a packed row, or padding). Query head h reads K/V head h / (n_heads / n_kv_heads): K and V
// are never replicated. The forward saves lse = log(sum(exp(scores))) per query and head; the
// backward recomputes the probabilities from it (as flash attention does) instead of storing
// the (T x T) matrix.
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

struct AttentionHeads {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
};

// k, v (N, n_kv_heads, head_dim); cu_seqlens (segments + 1) with cu_seqlens[0] = 0 and
// cu_seqlens.back() = N. Queries: every token when query_rows is empty, else query row i is
// token query_rows[i] (strictly ascending; context parallelism: this rank's tokens of the
// whole sequence); q, out (Nq, n_heads, head_dim); lse (n_heads, Nq).
void attention(std::span<float> out, std::span<float> lse, std::span<const float> q,
               std::span<const float> k, std::span<const float> v,
               std::span<const std::int32_t> cu_seqlens, AttentionHeads heads,
               std::span<const std::int32_t> query_rows = {});

// dq (Nq, n_heads, head_dim), dk, dv (N, n_kv_heads, head_dim), all overwritten: dk and dv
// are those of the listed queries' scores only (the other ranks' add to them).
void attention_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv,
                        std::span<const float> dout, std::span<const float> out,
                        std::span<const float> lse, std::span<const float> q,
                        std::span<const float> k, std::span<const float> v,
                        std::span<const std::int32_t> cu_seqlens, AttentionHeads heads,
                        std::span<const std::int32_t> query_rows = {});

}  // namespace l3::kernels::cpu
