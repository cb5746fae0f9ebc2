// RoPE inverse frequencies (with Llama 3.1's scaling) and the cos/sin tables the kernels read,
// computed in fp32 in the same order of operations as Hugging Face transformers
// (`_compute_default_rope_parameters`, `_compute_llama3_parameters`, LlamaRotaryEmbedding).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.hpp"
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

// The tables in a backend's memory, grown to the longest sequence asked for (training batches,
// generation's KV cache).
class RopeBuffers {
 public:
  // Makes the tables cover positions 0 .. positions-1 (rebuilt only when they grow).
  void ensure(kernels::Ops& ops, const ModelConfig& config, std::int64_t positions);
  // (positions, head_dim / 2) f32
  [[nodiscard]] kernels::ConstTensorView cos() const noexcept { return cos_.view(); }
  [[nodiscard]] kernels::ConstTensorView sin() const noexcept { return sin_.view(); }
  [[nodiscard]] std::int64_t positions() const noexcept { return positions_; }

 private:
  kernels::Buffer cos_;  // (positions, head_dim / 2) f32
  kernels::Buffer sin_;
  std::int64_t positions_ = 0;
};

}  // namespace l3::model
