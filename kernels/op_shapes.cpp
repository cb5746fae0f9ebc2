#include "kernels/op_shapes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string_view>
#include <utility>

#include "core/error.hpp"

namespace l3::kernels {

namespace {

// The checks of one op call; each throws core::internal_error naming the op and the tensor.
class ShapeCheck {
 public:
  explicit ShapeCheck(std::string_view op) : op_(op) {}

  // `x` read as a matrix is (rows, cols).
  void matrix(std::string_view name, ConstTensorView x, std::int64_t rows,
              std::int64_t cols) const {
    if (x.rows() != rows || x.row_size() != cols) {
      fail(name, x, fmt::format("{} rows of {}", rows, cols));
    }
  }
  void numel(std::string_view name, ConstTensorView x, std::int64_t count) const {
    if (x.numel() != count) fail(name, x, fmt::format("{} elements", count));
  }
  void rank(std::string_view name, ConstTensorView x, int rank) const {
    if (x.rank() != rank) fail(name, x, fmt::format("rank {}", rank));
  }
  void same(std::string_view name, ConstTensorView x, std::string_view like_name,
            ConstTensorView like) const {
    if (!(x.shape() == like.shape())) {
      fail(name, x, fmt::format("the shape of '{}', {}", like_name, like.shape().str()));
    }
  }
  void dtype(std::string_view name, ConstTensorView x, DType wanted) const {
    if (x.dtype() != wanted) {
      throw core::internal_error(fmt::format("{}: '{}' is {}, expected {}", op_, name,
                                             dtype_name(x.dtype()), dtype_name(wanted)));
    }
  }
  [[noreturn]] void fail(std::string_view name, ConstTensorView x, std::string_view wanted) const {
    throw core::internal_error(
        fmt::format("{}: '{}' has shape {}, expected {}", op_, name, x.shape().str(), wanted));
  }

 private:
  std::string_view op_;
};

}  // namespace

MatmulDims matmul_dims(const MatmulArgs& a) {
  const ShapeCheck check("matmul");
  const MatmulDims d{.m = a.x.rows(), .n = a.w.rows(), .k = a.w.row_size()};
  check.matrix("x", a.x, d.m, d.k);
  check.matrix("y", a.y, d.m, d.n);
  return d;
}

MatmulDims matmul_dims(const MatmulBackwardArgs& a) {
  const ShapeCheck check("matmul_backward");
  MatmulDims d{.m = a.dy.rows(), .n = a.dy.row_size()};
  if (a.dx.empty() && a.dw.empty()) return d;
  // K from the weight when dx is wanted (dx = dy W), else from the input (dw = dy^T x).
  d.k = a.dx.empty() ? a.x.row_size() : a.w.row_size();
  if (!a.dx.empty()) {
    check.matrix("w", a.w, d.n, d.k);
    check.matrix("dx", a.dx, d.m, d.k);
  }
  if (!a.dw.empty()) {
    check.matrix("x", a.x, d.m, d.k);
    check.matrix("dw", a.dw, d.n, d.k);
  }
  return d;
}

RowDims embedding_dims(const EmbeddingArgs& a) {
  const ShapeCheck check("embedding");
  const RowDims d{.rows = a.out.rows(), .hidden = a.out.row_size(), .vocab = a.table.rows()};
  check.numel("tokens", a.tokens, d.rows);
  check.matrix("table", a.table, d.vocab, d.hidden);
  return d;
}

RowDims embedding_dims(const EmbeddingBackwardArgs& a) {
  const ShapeCheck check("embedding_backward");
  const RowDims d{.rows = a.dout.rows(), .hidden = a.dout.row_size(), .vocab = a.dtable.rows()};
  check.numel("tokens", a.tokens, d.rows);
  check.matrix("dtable", a.dtable, d.vocab, d.hidden);
  return d;
}

RowDims rmsnorm_dims(const RmsNormArgs& a) {
  const ShapeCheck check("rmsnorm");
  const RowDims d{.rows = a.x.rows(), .hidden = a.x.row_size()};
  check.matrix("out", a.out, d.rows, d.hidden);
  check.numel("rstd", a.rstd, d.rows);
  check.numel("w", a.w, d.hidden);
  return d;
}

RowDims rmsnorm_dims(const RmsNormBackwardArgs& a) {
  const ShapeCheck check("rmsnorm_backward");
  const RowDims d{.rows = a.x.rows(), .hidden = a.x.row_size()};
  check.matrix("dx", a.dx, d.rows, d.hidden);
  check.matrix("dout", a.dout, d.rows, d.hidden);
  if (!a.dw.empty()) check.numel("dw", a.dw, d.hidden);
  check.numel("w", a.w, d.hidden);
  check.numel("rstd", a.rstd, d.rows);
  return d;
}

RopeDims rope_dims(const RopeArgs& a) {
  const ShapeCheck check("rope");
  check.rank("x", a.x, 3);
  const RopeDims d{.tokens = a.x.dim(0),
                   .heads = static_cast<int>(a.x.dim(1)),
                   .head_dim = static_cast<int>(a.x.dim(2))};
  check.numel("positions", a.positions, d.tokens);
  check.matrix("cos", a.cos, a.cos.rows(), d.head_dim / 2);
  check.same("sin", a.sin, "cos", a.cos);
  return d;
}

namespace {

AttentionShape attention_shape_of(const ShapeCheck& check, ConstTensorView q, ConstTensorView k,
                                  ConstTensorView v, ConstTensorView lse,
                                  const PackedSegments& segments, ConstTensorView query_rows) {
  check.rank("q", q, 3);
  check.rank("k", k, 3);
  AttentionShape s{.tokens = k.dim(0),
                   .n_heads = static_cast<int>(q.dim(1)),
                   .n_kv_heads = static_cast<int>(k.dim(1)),
                   .head_dim = static_cast<int>(q.dim(2)),
                   .n_segments = static_cast<int>(segments.cu_seqlens.numel()) - 1,
                   .max_segment = segments.max_segment,
                   .host_cu_seqlens = segments.host,
                   .queries = q.dim(0)};
  if (query_rows.empty() ? k.dim(0) != s.queries : query_rows.numel() != s.queries) {
    if (query_rows.empty())
      check.fail("k", k, fmt::format("({}, n_kv_heads, {})", s.queries, s.head_dim));
    check.fail("query_rows", query_rows, fmt::format("({}) i32, a row of q each", s.queries));
  }
  if (!query_rows.empty()) check.dtype("query_rows", query_rows, DType::i32);
  if (k.dim(2) != s.head_dim) {
    check.fail("k", k, fmt::format("({}, n_kv_heads, {})", s.tokens, s.head_dim));
  }
  if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0) {
    check.fail("k", k, fmt::format("a number of heads dividing q's {}", s.n_heads));
  }
  check.same("v", v, "k", k);
  check.matrix("lse", lse, s.n_heads, s.queries);
  if (s.n_segments < 0) check.fail("cu_seqlens", segments.cu_seqlens, "n_segments + 1 entries");
  if (!segments.host.empty() &&
      static_cast<std::int64_t>(segments.host.size()) != segments.cu_seqlens.numel()) {
    throw core::internal_error(fmt::format("attention: {} host cu_seqlens for {} on the backend",
                                           segments.host.size(), segments.cu_seqlens.numel()));
  }
  return s;
}

}  // namespace

AttentionShape attention_shape(const AttentionArgs& a) {
  const ShapeCheck check("attention");
  const AttentionShape s =
      attention_shape_of(check, a.q, a.k, a.v, a.lse, a.segments, a.query_rows);
  check.same("out", a.out, "q", a.q);
  return s;
}

AttentionShape attention_shape(const AttentionBackwardArgs& a) {
  const ShapeCheck check("attention_backward");
  const AttentionShape s =
      attention_shape_of(check, a.q, a.k, a.v, a.lse, a.segments, a.query_rows);
  check.same("out", a.out, "q", a.q);
  check.same("dout", a.dout, "q", a.q);
  check.same("dq", a.dq, "q", a.q);
  check.same("dk", a.dk, "k", a.k);
  check.same("dv", a.dv, "k", a.k);
  return s;
}

namespace {

KvCacheDims cache_dims(const ShapeCheck& check, ConstTensorView k_cache, ConstTensorView v_cache,
                       ConstTensorView slots, ConstTensorView positions, std::int64_t rows) {
  check.rank("k_cache", k_cache, 4);
  check.same("v_cache", v_cache, "k_cache", k_cache);
  const KvCacheDims d{.rows = rows,
                      .n_kv_heads = static_cast<int>(k_cache.dim(2)),
                      .head_dim = static_cast<int>(k_cache.dim(3)),
                      .slots = k_cache.dim(0),
                      .capacity = k_cache.dim(1)};
  check.numel("slots", slots, rows);
  check.numel("positions", positions, rows);
  return d;
}

}  // namespace

KvCacheDims kv_cache_write_dims(const KvCacheWriteArgs& a) {
  const ShapeCheck check("kv_cache_write");
  check.rank("k", a.k, 3);
  const KvCacheDims d = cache_dims(check, a.k_cache, a.v_cache, a.slots, a.positions, a.k.dim(0));
  if (a.k.dim(1) != d.n_kv_heads || a.k.dim(2) != d.head_dim) {
    check.fail("k", a.k, fmt::format("({}, {}, {})", d.rows, d.n_kv_heads, d.head_dim));
  }
  check.same("v", a.v, "k", a.k);
  return d;
}

KvCacheDims decode_attention_dims(const DecodeAttentionArgs& a) {
  const ShapeCheck check("decode_attention");
  check.rank("q", a.q, 3);
  KvCacheDims d = cache_dims(check, a.k_cache, a.v_cache, a.slots, a.positions, a.q.dim(0));
  d.n_heads = static_cast<int>(a.q.dim(1));
  d.max_keys = a.max_keys;
  if (a.q.dim(2) != d.head_dim) {
    check.fail("q", a.q, fmt::format("(n, n_heads, {})", d.head_dim));
  }
  if (d.n_kv_heads <= 0 || d.n_heads % d.n_kv_heads != 0) {
    check.fail("k_cache", a.k_cache, fmt::format("a number of heads dividing q's {}", d.n_heads));
  }
  check.same("out", a.out, "q", a.q);
  if (d.rows > 0 && (a.max_keys < 1 || a.max_keys > d.capacity)) {
    throw core::internal_error(
        fmt::format("decode_attention: max_keys {} outside [1, {}]", a.max_keys, d.capacity));
  }
  if (!a.host_positions.empty() && static_cast<std::int64_t>(a.host_positions.size()) != d.rows) {
    throw core::internal_error(fmt::format("decode_attention: {} host positions for {} rows",
                                           a.host_positions.size(), d.rows));
  }
  return d;
}

SampleDims sample_tokens_dims(const SampleTokensArgs& a) {
  const ShapeCheck check("sample_tokens");
  check.rank("logits", a.logits, 2);
  SampleDims d{.rows = a.logits.dim(0), .vocab = a.logits.dim(1)};
  check.numel("tokens", a.tokens, d.rows);
  check.numel("uniforms", a.uniforms, d.rows);
  if (!a.logprobs.empty()) check.numel("logprobs", a.logprobs, d.rows);
  d.candidates = a.vocab_limit > 0 ? std::min(a.vocab_limit, d.vocab) : d.vocab;
  if (d.vocab < 1 || a.vocab_limit < 0 || !(a.temperature >= 0.0) ||
      !(a.top_p > 0.0 && a.top_p <= 1.0) || a.top_k < 0) {
    throw core::internal_error(fmt::format(
        "sample_tokens: vocabulary {}, vocab_limit {}, temperature {}, top_p {}, top_k {}", d.vocab,
        a.vocab_limit, a.temperature, a.top_p, a.top_k));
  }
  return d;
}

std::int64_t swiglu_size(const SwigluArgs& a) {
  const ShapeCheck check("swiglu");
  check.same("gate", a.gate, "out", a.out);
  check.same("up", a.up, "out", a.out);
  return a.out.numel();
}

std::int64_t swiglu_size(const SwigluBackwardArgs& a) {
  const ShapeCheck check("swiglu_backward");
  check.same("dgate", a.dgate, "dout", a.dout);
  check.same("dup", a.dup, "dout", a.dout);
  check.same("gate", a.gate, "dout", a.dout);
  check.same("up", a.up, "dout", a.dout);
  return a.dout.numel();
}

std::int64_t add_into_size(ConstTensorView dst, ConstTensorView src) {
  ShapeCheck("add_into").numel("src", src, dst.numel());
  return dst.numel();
}

std::int64_t adamw_size(const AdamWArgs& a) {
  const ShapeCheck check("adamw");
  const std::int64_t n = a.params.numel();
  check.numel("grads", a.grads, n);
  check.numel("m", a.m, n);
  check.numel("v", a.v, n);
  if (!a.params_copy.empty()) check.numel("params_copy", a.params_copy, n);
  return n;
}

std::int64_t dropout_size(const DropoutArgs& a) {
  const ShapeCheck check("dropout");
  check.same("out", a.out, "x", a.x);
  if (!(a.p >= 0.0F && a.p < 1.0F)) {
    throw core::internal_error(fmt::format("dropout: p = {} is outside [0, 1)", a.p));
  }
  return a.x.numel();
}

LmHeadDims lm_head_dims(const LmHeadCrossEntropyArgs& a) {
  const ShapeCheck check("lm_head_cross_entropy");
  const LmHeadDims d{
      .n = a.h.rows(), .counted = a.rows.numel(), .vocab = a.w.rows(), .hidden = a.h.row_size()};
  check.matrix("w", a.w, d.vocab, d.hidden);
  check.numel("targets", a.targets, d.counted);
  if (!a.loss_sum.empty()) check.numel("loss_sum", a.loss_sum, 1);
  if (!a.row_loss.empty()) check.numel("row_loss", a.row_loss, d.counted);
  if (!a.row_scale.empty()) check.numel("row_scale", a.row_scale, d.counted);
  if (!a.row_entropy.empty()) {
    check.numel("row_entropy", a.row_entropy, d.counted);
    check.dtype("row_entropy", a.row_entropy, DType::f32);
  }
  if (!a.dh.empty()) {
    check.matrix("dh", a.dh, d.n, d.hidden);
    if (!a.dw.empty()) check.matrix("dw", a.dw, d.vocab, d.hidden);
  }
  return d;
}

GatherDims gather_dot_dims(const GatherDotArgs& a) {
  const ShapeCheck check("gather_dot");
  const GatherDims d{.count = a.rows.numel(), .hidden = a.h.row_size()};
  check.numel("w", a.w, d.hidden);
  check.numel("scores", a.scores, d.count);
  return d;
}

GatherDims gather_dot_dims(const GatherDotBackwardArgs& a) {
  const ShapeCheck check("gather_dot_backward");
  const GatherDims d{.count = a.rows.numel(), .hidden = a.h.row_size()};
  check.same("dh", a.dh, "h", a.h);
  check.numel("dw", a.dw, d.hidden);
  check.numel("w", a.w, d.hidden);
  check.numel("dscores", a.dscores, d.count);
  return d;
}

std::int64_t bradley_terry_pairs(const BradleyTerryArgs& a) {
  const ShapeCheck check("bradley_terry");
  const std::int64_t pairs = a.scores.numel() / 2;
  check.numel("scores", a.scores, 2 * pairs);
  check.numel("sums", a.sums, 3);
  if (!a.margins.empty()) check.numel("margins", a.margins, pairs);
  if (!a.d_scores.empty()) check.numel("d_scores", a.d_scores, 2 * pairs);
  return pairs;
}

std::int64_t sequence_count(const SequenceLogProbsArgs& a) {
  const ShapeCheck check("sequence_log_probs");
  const std::int64_t sequences = a.logps.numel();
  check.numel("ranges", a.ranges, 2 * sequences);
  return sequences;
}

std::int64_t dpo_pairs(const DpoLossArgs& a) {
  const ShapeCheck check("dpo_loss");
  const std::int64_t pairs = a.reference.numel() / 2;
  check.numel("reference", a.reference, 2 * pairs);
  check.numel("ranges", a.ranges, 4 * pairs);
  check.numel("sums", a.sums, 4);
  if (!a.d_rows.empty()) check.numel("d_rows", a.d_rows, a.row_loss.numel());
  return pairs;
}

std::int64_t policy_rows(const PolicyLossArgs& a) {
  const ShapeCheck check("policy_loss");
  const std::int64_t rows = a.row_loss.numel();
  const bool sampling = a.importance_sampling != ImportanceSampling::off;
  check.numel("sums", a.sums, sampling ? 8 : 5);
  check.dtype("sums", a.sums, DType::f64);
  // Per row, f32: required (may be empty only with C = 0), then optional.
  const std::pair<std::string_view, ConstTensorView> required[] = {
      {"row_loss", a.row_loss}, {"advantages", a.advantages}, {"weights", a.weights}};
  for (const auto& [name, x] : required) {
    check.numel(name, x, rows);
    if (rows > 0) check.dtype(name, x, DType::f32);
  }
  const std::pair<std::string_view, ConstTensorView> optional[] = {
      {"old_logps", a.old_logps},
      {"ref_row_loss", a.ref_row_loss},
      {"sampled_logps", a.sampled_logps},
      {"row_entropy", a.row_entropy},
      {"d_rows", a.d_rows}};
  for (const auto& [name, x] : optional) {
    if (x.empty()) continue;
    check.numel(name, x, rows);
    check.dtype(name, x, DType::f32);
  }
  if (!a.sampled_logps.empty() || !a.largest.empty()) {
    check.numel("largest", a.largest, sampling ? 3 : 1);
    check.dtype("largest", a.largest, DType::f64);
  }
  if (sampling) {
    // The ratio is the trainer's probability over the generator's: it needs the latter.
    if (rows > 0 && a.sampled_logps.empty())
      throw core::internal_error("policy_loss: importance sampling without sampled_logps");
    if (!(a.clip_min >= 0.0 && a.clip_max >= a.clip_min)) {
      throw core::internal_error(
          fmt::format("policy_loss: importance sampling bounds [{}, {}]", a.clip_min, a.clip_max));
    }
  }
  if (is_sequence_level(a.importance_sampling)) {
    // (S + 1) boundaries, S >= 1 when there are rows (their contents: the backend's check).
    if (rows > 0 && a.completion_starts.numel() < 2)
      check.fail("completion_starts", a.completion_starts, "S + 1 >= 2 elements");
    if (!a.completion_starts.empty()) {
      check.rank("completion_starts", a.completion_starts, 1);
      check.dtype("completion_starts", a.completion_starts, DType::i32);
    }
  } else if (!a.completion_starts.empty()) {
    throw core::internal_error(
        "policy_loss: completion_starts without sequence-level importance sampling");
  }
  if (!(a.epsilon_low >= 0.0 && a.epsilon_high >= 0.0 && a.beta >= 0.0) ||
      !std::isfinite(a.epsilon_high) || !std::isfinite(a.beta)) {
    throw core::internal_error(fmt::format("policy_loss: epsilon_low {}, epsilon_high {}, beta {}",
                                           a.epsilon_low, a.epsilon_high, a.beta));
  }
  return rows;
}

}  // namespace l3::kernels
