// Autoregressive generation with a KV cache for a LlamaModel with a language-model head.
//
// The prompt is run through the model once, all its tokens as rows of the matmuls (prefill),
// then each new token alone (decode), reading the keys and values of earlier positions from
// the cache instead of recomputing them. Every layer runs through kernels::Ops, and so does the
// attention of a prefill into an empty cache (one causal segment: the training kernel); the
// attention of new queries against a non-empty cache is a host loop: causal (position p
// attends to 0..p), GQA by indexing (query head h reads KV head h / (n_heads / n_kv_heads)),
// scale 1/sqrt(head_dim), RoPE at absolute positions. The logits equal those of
// LlamaModel::logits on the whole sequence. Tested on the CPU backend (fp32), where the copies
// to the host cost nothing; another backend would copy q/k/v once per layer and step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/ops.hpp"
#include "model/llama_model.hpp"
#include "model/rope_table.hpp"
#include "model/token_sampler.hpp"

namespace l3::model {

struct GenerationOptions {
  std::int64_t max_new = 128;  // new tokens at most (the stop token included)
  double temperature = 0.0;    // 0: greedy
  double top_p = 1.0;          // nucleus sampling when < 1 (and temperature > 0)
  std::uint64_t seed = 0;      // token i is drawn with CounterRng(seed, sampling).uniform(i)
  std::vector<std::int32_t> stop_tokens{};
  // Draw only ids below this (a tokenizer smaller than the model's vocabulary); 0: all.
  std::int64_t vocab_limit = 0;
  // Also the log-probability of each prompt token after the first, given the ones before it
  // (the prefill then keeps the logits of every prompt position).
  bool prompt_logprobs = false;
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // the new tokens, without the stop token
  // log p(token) of each new token under the model: log-softmax of its logits over the whole
  // vocabulary, before temperature and top-p (what transformers' log_softmax(logits) gives)
  std::vector<double> logprobs;
  // With GenerationOptions::prompt_logprobs: log p(prompt[i] | prompt[0..i)) for i >= 1.
  std::vector<double> prompt_logprobs;
  bool stopped = false;  // ended on a stop token (not on max_new)
};

// log-softmax of `logits` at `token`, in double.
[[nodiscard]] double log_probability(std::span<const float> logits, std::int32_t token);

class Generator {
 public:
  // The model must have a language-model head; it is used, never modified.
  explicit Generator(LlamaModel& model);

  // Empties the cache and sizes it for `capacity` positions: a usage Error beyond the
  // model's max_position_embeddings.
  void reset(std::int64_t capacity);
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  // Positions in the cache (the tokens run so far).
  [[nodiscard]] std::int64_t length() const noexcept { return length_; }

  // Runs `tokens` at positions length() .. length() + n - 1, appends their keys and values to
  // the cache and returns the logits: (n, V) with all_rows, else (V) of the last token only.
  std::vector<float> extend(std::span<const std::int32_t> tokens, bool all_rows = false);

  // Prefill of `prompt` (not empty), then up to options.max_new tokens, one at a time. The
  // cache is sized to prompt + max_new positions: a usage Error beyond max_position_embeddings.
  GenerationResult generate(std::span<const std::int32_t> prompt, const GenerationOptions& options);

 private:
  void ensure_workspace(std::int64_t n);
  void attend(int layer, std::int64_t n);  // q_host_, the cache -> att_host_

  LlamaModel& model_;
  kernels::Ops& ops_;
  kernels::DType act_;
  std::int64_t capacity_ = 0;
  std::int64_t length_ = 0;
  // (layers, capacity, n_kv_heads, head_dim), on the host
  std::vector<float> k_cache_;
  std::vector<float> v_cache_;
  RopeBuffers rope_;
  // Per-step activations on the backend, for up to workspace_ tokens.
  std::int64_t workspace_ = 0;
  kernels::Buffer tokens_, positions_;   // (n) i32
  kernels::Buffer cu_seqlens_, lse_;     // (2) i32: one segment {0, n}; (n_heads, n) f32
  kernels::Buffer x_, h_, ln_, rstd_;    // (n, H), (n) f32
  kernels::Buffer q_, k_, v_, att_;      // (n, n_heads | n_kv_heads, head_dim)
  kernels::Buffer gate_, up_, act_buf_;  // (n, I)
  kernels::Buffer logits_;               // (n, V) f32
  // Host copies for the attention: (n, n_heads, head_dim), (n, n_kv_heads, head_dim) x 2
  std::vector<float> q_host_, k_host_, v_host_, att_host_;
};

}  // namespace l3::model
