#include "model/generator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.hpp"
#include "core/host_memory.hpp"
#include "core/rng.hpp"
#include "model/decoder_block.hpp"
#include "model/rope_table.hpp"

namespace l3::model {

using kernels::ConstTensorView;
using kernels::DType;
using kernels::Shape;
using kernels::TensorView;

namespace {

template <typename T>
ConstTensorView host_view(const std::vector<T>& values) {
  return ConstTensorView(std::span<const T>(values));
}

}  // namespace

Generator::Generator(LlamaModel& model)
    : model_(model), ops_(model.ops()), act_(model.ops().compute_dtype()) {
  if (model.layout().head() != HeadKind::language_model) {
    throw core::usage_error(
        "generation needs a model with a language-model head, not a reward "
        "model");
  }
}

void Generator::reset(std::int64_t capacity) {
  const ModelConfig& c = model_.config();
  if (capacity < 1) throw core::internal_error(fmt::format("KV cache of {} positions", capacity));
  if (capacity > c.max_position_embeddings) {
    throw core::usage_error(fmt::format(
        "{} positions (prompt + new tokens) exceed the model's max_position_embeddings {}",
        capacity, c.max_position_embeddings));
  }
  const auto cache = static_cast<std::size_t>(c.n_layers * capacity * c.kv_size());
  const std::int64_t host = core::host_memory_bytes();
  if (const auto bytes = static_cast<std::int64_t>(2 * cache * sizeof(float));
      host > 0 && bytes > host) {
    throw core::usage_error(fmt::format(
        "the KV cache of {} positions (prompt + new tokens) needs {:.1f} GiB, more than this "
        "node's {:.1f} GiB: lower --max-new",
        capacity, static_cast<double>(bytes) / (1U << 30U),
        static_cast<double>(host) / (1U << 30U)));
  }
  k_cache_.assign(cache, 0.0F);
  v_cache_.assign(cache, 0.0F);
  capacity_ = capacity;
  length_ = 0;
  rope_.ensure(ops_, c, capacity);
}

void Generator::ensure_workspace(std::int64_t n) {
  if (n <= workspace_) return;
  const ModelConfig& c = model_.config();
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();
  const auto alloc = [&](DType dtype, const Shape& shape) {
    return kernels::allocate(ops_, dtype, shape);
  };
  const Shape hidden{n, c.hidden_size};
  const Shape heads{n, c.n_heads, c.head_dim};
  const Shape kv_heads{n, c.n_kv_heads, c.head_dim};
  const Shape intermediate{n, c.intermediate_size};
  tokens_ = alloc(DType::i32, n);
  positions_ = alloc(DType::i32, n);
  cu_seqlens_ = alloc(DType::i32, 2);
  lse_ = alloc(DType::f32, {c.n_heads, n});
  x_ = alloc(act_, hidden);
  h_ = alloc(act_, hidden);
  ln_ = alloc(act_, hidden);
  rstd_ = alloc(DType::f32, n);
  q_ = alloc(act_, heads);
  k_ = alloc(act_, kv_heads);
  v_ = alloc(act_, kv_heads);
  att_ = alloc(act_, heads);
  gate_ = alloc(act_, intermediate);
  up_ = alloc(act_, intermediate);
  act_buf_ = alloc(act_, intermediate);
  logits_ = alloc(DType::f32, {n, c.vocab_size});
  q_host_.resize(static_cast<std::size_t>(n * q));
  k_host_.resize(static_cast<std::size_t>(n * kv));
  v_host_.resize(static_cast<std::size_t>(n * kv));
  att_host_.resize(static_cast<std::size_t>(n * q));
  workspace_ = n;
}

void Generator::attend(int layer, std::int64_t n) {
  const ModelConfig& c = model_.config();
  const std::int64_t hd = c.head_dim;
  const std::int64_t heads = c.n_heads;
  const std::int64_t kv_heads = c.n_kv_heads;
  const std::int64_t group = heads / kv_heads;
  const std::int64_t first = length_;  // absolute position of new token 0
  const float scale = 1.0F / std::sqrt(static_cast<float>(hd));
  // K/V of position j, KV head g: cache[((layer * capacity + j) * kv_heads + g) * hd]
  const std::int64_t layer_base = layer * capacity_ * kv_heads * hd;
  const float* keys = k_cache_.data() + layer_base;
  const float* values = v_cache_.data() + layer_base;

  // Each (query, head) output is written by one thread: deterministic.
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t t = 0; t < n; ++t) {
    for (std::int64_t head = 0; head < heads; ++head) {
      const std::int64_t p = first + t;  // attends to positions 0 .. p
      const std::int64_t g = head / group;
      const float* q = q_host_.data() + (t * heads + head) * hd;
      std::vector<float> scores(static_cast<std::size_t>(p + 1));
      float max = -INFINITY;
      for (std::int64_t j = 0; j <= p; ++j) {
        const float* k = keys + (j * kv_heads + g) * hd;
        float dot = 0.0F;
        for (std::int64_t d = 0; d < hd; ++d) dot += q[d] * k[d];
        scores[static_cast<std::size_t>(j)] = dot * scale;
        max = std::max(max, dot * scale);
      }
      float sum = 0.0F;
      for (float& s : scores) {
        s = std::exp(s - max);
        sum += s;
      }
      float* out = att_host_.data() + (t * heads + head) * hd;
      std::fill(out, out + hd, 0.0F);
      for (std::int64_t j = 0; j <= p; ++j) {
        const float w = scores[static_cast<std::size_t>(j)] / sum;
        const float* v = values + (j * kv_heads + g) * hd;
        for (std::int64_t d = 0; d < hd; ++d) out[d] += w * v[d];
      }
    }
  }
}

std::vector<float> Generator::extend(std::span<const std::int32_t> tokens, bool all_rows) {
  const ModelConfig& c = model_.config();
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n == 0) throw core::internal_error("Generator::extend without tokens");
  if (length_ + n > capacity_) {
    throw core::internal_error(fmt::format("KV cache of {} positions holds {}; {} more do not fit",
                                           capacity_, length_, n));
  }
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size) {
      throw core::bad_input(
          fmt::format("token id {} at position {} is not below the vocabulary "
                      "size {}",
                      tokens[t], length_ + static_cast<std::int64_t>(t), c.vocab_size));
    }
  }
  ensure_workspace(n);
  const std::int64_t h = c.hidden_size;
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();
  const std::int64_t v = c.vocab_size;
  const auto eps = static_cast<float>(c.rms_norm_eps);

  std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
  std::vector<std::int32_t> positions(tokens.size());
  for (std::size_t t = 0; t < positions.size(); ++t) {
    positions[t] = static_cast<std::int32_t>(length_ + static_cast<std::int64_t>(t));
  }
  ops_.copy(tokens_.first_rows(n), host_view(ids));
  ops_.copy(positions_.first_rows(n), host_view(positions));
  // Into an empty cache the new tokens attend only to each other: one causal segment, the
  // backend's own attention kernel (a long prompt costs what a training forward does).
  const bool prefill = length_ == 0;
  const std::vector<std::int32_t> segments = {0, static_cast<std::int32_t>(n)};
  if (prefill) ops_.copy(cu_seqlens_.view(), host_view(segments));

  const TensorView x = x_.first_rows(n);  // (n, H) the residual stream, in and out
  // One row buffer for both norms of a block (nothing reads them after the block).
  const BlockViews a{.ln1 = ln_.first_rows(n),
                     .rstd1 = rstd_.first_rows(n),
                     .q = q_.first_rows(n),
                     .k = k_.first_rows(n),
                     .v = v_.first_rows(n),
                     .att = att_.first_rows(n),
                     .lse = lse_.first({c.n_heads, n}),
                     .h = h_.first_rows(n),  // after the attention half
                     .ln2 = ln_.first_rows(n),
                     .rstd2 = rstd_.first_rows(n),
                     .gate = gate_.first_rows(n),
                     .up = up_.first_rows(n),
                     .act = act_buf_.first_rows(n)};
  const RopeViews rope{
      .positions = positions_.first_rows(n), .cos = rope_.cos(), .sin = rope_.sin()};
  const auto host = [](std::vector<float>& values, std::int64_t count) {
    return TensorView(std::span<float>(values).first(static_cast<std::size_t>(count)));
  };
  const auto host_const = [](const std::vector<float>& values, std::int64_t count) {
    return ConstTensorView(std::span<const float>(values).first(static_cast<std::size_t>(count)));
  };

  const ConstTensorView params = model_.parameters();
  const ParameterLayout& layout = model_.layout();
  const auto weight = [&](std::int64_t offset, const Shape& shape) {
    return params.slice(offset, shape.numel()).reshape(shape);
  };
  ops_.embedding(
      {.out = x, .tokens = tokens_.first_rows(n), .table = weight(layout.embedding(), {v, h})});
  for (int l = 0; l < c.n_layers; ++l) {
    // The attention: the new rows' K and V into the cache, then the new queries against every
    // cached position (a prefill: against each other, with the backend's kernel).
    const auto attend_cached = [&] {
      ops_.copy(host(k_host_, n * kv), a.k);
      ops_.copy(host(v_host_, n * kv), a.v);
      if (prefill) {
        ops_.attention({.out = a.att,
                        .lse = a.lse,
                        .q = a.q,
                        .k = a.k,
                        .v = a.v,
                        .segments = {.cu_seqlens = cu_seqlens_.view(),
                                     .max_segment = static_cast<int>(n),
                                     .host = segments}});
      } else {
        ops_.copy(host(q_host_, n * q), a.q);
      }
      ops_.synchronize();
      // the new rows of the cache: positions length_ .. length_ + n - 1 of this layer
      const auto row = static_cast<std::ptrdiff_t>((l * capacity_ + length_) * kv);
      std::copy_n(k_host_.begin(), n * kv, k_cache_.begin() + row);
      std::copy_n(v_host_.begin(), n * kv, v_cache_.begin() + row);
      if (!prefill) {
        attend(l, n);
        ops_.copy(a.att, host_const(att_host_, n * q));
      }
    };
    decoder_block_forward(ops_, c, block_weights(layout, l, weight), rope, x, x, a, attend_cached);
  }
  length_ += n;

  // final norm and lm_head, of every new row or of the last one only
  const std::int64_t rows = all_rows ? n : 1;
  const std::int64_t first_row = n - rows;
  ops_.rmsnorm({.out = ln_.first_rows(rows),
                .rstd = rstd_.first_rows(rows),
                .x = x_.slice(first_row * h, rows * h).reshape({rows, h}),
                .w = weight(layout.final_norm(), h),
                .eps = eps});
  // the embedding when tied
  ops_.matmul({.y = logits_.first_rows(rows),
               .x = ln_.first_rows(rows),
               .w = weight(layout.lm_head(), {v, h})});
  std::vector<float> logits(static_cast<std::size_t>(rows * v));
  ops_.copy(host(logits, rows * v), logits_.slice(0, rows * v));
  ops_.synchronize();
  return logits;
}

double log_probability(std::span<const float> logits, std::int32_t token) {
  if (token < 0 || static_cast<std::size_t>(token) >= logits.size()) {
    throw core::internal_error(
        fmt::format("log_probability: token {} outside {} logits", token, logits.size()));
  }
  const float top = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (const float l : logits) sum += std::exp(static_cast<double>(l) - top);
  return static_cast<double>(logits[static_cast<std::size_t>(token)]) - top - std::log(sum);
}

GenerationResult Generator::generate(std::span<const std::int32_t> prompt,
                                     const GenerationOptions& options) {
  if (prompt.empty()) throw core::usage_error("generation needs a prompt of at least one token");
  if (options.max_new < 0) {
    throw core::usage_error(fmt::format("max-new must be >= 0, not {}", options.max_new));
  }
  const SamplingParams sampling{options.temperature, options.top_p};
  validate(sampling);
  GenerationResult result;
  if (options.max_new == 0 && !options.prompt_logprobs) return result;
  reset(static_cast<std::int64_t>(prompt.size()) + options.max_new);

  const std::int64_t vocab = model_.config().vocab_size;
  const auto limit = static_cast<std::size_t>(
      options.vocab_limit > 0 ? std::min(options.vocab_limit, vocab) : vocab);
  const core::CounterRng rng(options.seed, core::RngPurpose::sampling);
  std::vector<float> logits;  // (V) of the last prompt token
  if (options.prompt_logprobs) {
    const std::vector<float> all = extend(prompt, true);  // (prompt, V)
    const auto v = static_cast<std::size_t>(vocab);
    for (std::size_t i = 1; i < prompt.size(); ++i) {
      result.prompt_logprobs.push_back(
          log_probability(std::span<const float>(all).subspan((i - 1) * v, v), prompt[i]));
    }
    logits.assign(all.end() - static_cast<std::ptrdiff_t>(v), all.end());
  } else {
    logits = extend(prompt);
  }
  for (std::int64_t t = 0; t < options.max_new; ++t) {
    const std::int32_t token = sample_token(std::span<const float>(logits).first(limit), sampling,
                                            rng.uniform(static_cast<std::uint64_t>(t)));
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) !=
        options.stop_tokens.end()) {
      result.stopped = true;
      break;
    }
    result.tokens.push_back(token);
    result.logprobs.push_back(log_probability(logits, token));
    if (t + 1 == options.max_new) break;  // its logits are never needed
    const std::array<std::int32_t, 1> next = {token};
    logits = extend(next);
  }
  return result;
}

}  // namespace l3::model
