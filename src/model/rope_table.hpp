// RoPE inverse frequencies (with Llama 3.1's scaling) and the cos/sin tables the kernels read,
// computed in fp32 in the same order of operations as Hugging Face transformers
// (`_compute_default_rope_parameters`, `_compute_llama3_parameters`, LlamaRotaryEmbedding).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_config.hpp"

namespace l3::model {

// inv_freq[i] = 1 / theta^(2i / head_dim), i < head_dim/2, then the llama3 scaling: wavelengths
// longer than original_max/low_freq_factor are divided by factor, shorter than
// original_max/high_freq_factor kept, and those between interpolated smoothly.
[[nodiscard]] std::vector<float> rope_inverse_frequencies(const ModelConfig& config);

struct RopeTable {
  std::int64_t positions = 0;  // rows: positions 0 .. positions-1
  int half = 0;                // columns: head_dim / 2
  std::vector<float> cos;      // (positions, half): cos(position * inv_freq[i])
  std::vector<float> sin;
};

[[nodiscard]] RopeTable make_rope_table(const ModelConfig& config, std::int64_t positions);

}  // namespace l3::model
