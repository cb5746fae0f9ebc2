// The shape of a Llama 3 model: built-in presets, or a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace l3::model {

// Llama 3.1's frequency-dependent RoPE scaling ("rope_type": "llama3").
struct RopeScaling {
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

// The largest shapes validate() accepts: far beyond Llama 3.1 405B (hidden 16384, FFN 53248,
// 126 layers, 128 heads of 128), so that only a mistyped number is refused.
inline constexpr std::int64_t kMaxHiddenSize = std::int64_t{1} << 17U;
inline constexpr std::int64_t kMaxIntermediateSize = std::int64_t{1} << 19U;
inline constexpr std::int64_t kMaxLayers = 2048;
inline constexpr std::int64_t kMaxHeads = 4096;
inline constexpr std::int64_t kMaxHeadDim = 4096;
inline constexpr std::int64_t kMaxPositions = std::int64_t{1} << 24U;
inline constexpr double kMaxParameters = 1e13;

struct ModelConfig {
  std::string name;  // preset name or the config file it came from
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  std::int64_t max_position_embeddings = 0;
  double rope_theta = 500000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  // Tensor parallelism (model/tensor_slice.hpp): this is one of `tensor_slices` slices of a
  // model, with 1/tensor_slices of its heads, MLP columns and vocabulary (its attention's
  // n_heads x head_dim is hidden_size / tensor_slices). 1: a whole model.
  int tensor_slices = 1;

  // Throws a bad_input Error naming `name` when the numbers cannot describe a model.
  void validate() const;

  [[nodiscard]] std::int64_t q_size() const {
    return static_cast<std::int64_t>(n_heads) * head_dim;
  }
  [[nodiscard]] std::int64_t kv_size() const {
    return static_cast<std::int64_t>(n_kv_heads) * head_dim;
  }
  // Parameters of one decoder block.
  [[nodiscard]] std::int64_t block_parameters() const;
  // All parameters of the language model (embedding, blocks, final norm, lm_head if untied).
  [[nodiscard]] std::int64_t parameter_count() const;
  // Parameters that take part in matmuls per token (the blocks and the lm_head, or the score
  // head of a reward model; not the input embedding lookup): the N of the PaLM FLOP formula
  // 6N + 12 L H Q T.
  [[nodiscard]] std::int64_t flop_parameters(bool language_model_head = true) const;
  // Training FLOPs per token at sequence length T (PaLM): 6N + 12 L H Q T with H Q = hidden.
  [[nodiscard]] double training_flops_per_token(std::int64_t seq_len,
                                                bool language_model_head = true) const;

  [[nodiscard]] nlohmann::json to_hf_json() const;
};

[[nodiscard]] std::vector<std::string_view> preset_names();
// Throws a usage Error listing the presets when the name is unknown.
[[nodiscard]] ModelConfig preset(std::string_view name);
// From a Hugging Face config.json object; `origin` names it in errors.
[[nodiscard]] ModelConfig from_hf_config(const nlohmann::json& config, const std::string& origin);
[[nodiscard]] ModelConfig load_hf_config(const std::string& path);
// --model: a preset name, a config.json file, or a directory holding one.
[[nodiscard]] ModelConfig resolve_model(const std::string& preset_or_path);

}  // namespace l3::model
