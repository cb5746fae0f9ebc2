// Where every parameter lives in the one flat buffer: Hugging Face names, shapes ([out, in] for
// linear layers) and order. Gradients, optimizer moments and checkpoints use the same layout,
// so a ZeRO shard or a checkpoint slice is just a range of it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/model_config.hpp"

namespace l3::model {

// What sits on top of the backbone: a language-model head (lm_head, or the tied embedding),
// or the reward model's scalar score head (Hugging Face LlamaForSequenceClassification).
enum class HeadKind { language_model, reward };

struct TensorInfo {
  std::string name;                 // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<std::int64_t> shape;  // e.g. {q_size, hidden}
  std::int64_t offset = 0;          // elements from the start of the flat buffer
  std::int64_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (2-D weights, not norms)
};

// A range [begin, end) of the flat buffer.
struct FlatRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  [[nodiscard]] std::int64_t size() const noexcept { return end - begin; }
};

// Offsets of one decoder block's tensors.
struct BlockOffsets {
  std::int64_t input_norm, q_proj, k_proj, v_proj, o_proj, post_attention_norm, gate_proj, up_proj,
      down_proj;
};

class ParameterLayout {
 public:
  // Tensors start at multiples of this many elements (aligned vector loads on every backend).
  static constexpr std::int64_t kAlignment = 64;

  ParameterLayout(const ModelConfig& config, HeadKind head);

  [[nodiscard]] const ModelConfig& config() const noexcept { return config_; }
  [[nodiscard]] HeadKind head() const noexcept { return head_; }
  [[nodiscard]] const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  // Elements in the flat buffer, alignment padding included (padding stays zero).
  [[nodiscard]] std::int64_t total() const noexcept { return total_; }
  // Sum of the tensors' elements, without padding.
  [[nodiscard]] std::int64_t parameter_count() const noexcept;
  // Throws an internal Error for an unknown name.
  [[nodiscard]] const TensorInfo& find(std::string_view name) const;

  [[nodiscard]] std::int64_t embedding() const noexcept { return embedding_; }
  [[nodiscard]] const BlockOffsets& block(int layer) const {
    return blocks_.at(static_cast<std::size_t>(layer));
  }
  [[nodiscard]] std::int64_t final_norm() const noexcept { return final_norm_; }
  // The lm_head weights (V, H): the embedding itself when tied. Language-model head only.
  [[nodiscard]] std::int64_t lm_head() const noexcept { return lm_head_; }
  [[nodiscard]] bool lm_head_tied() const noexcept { return lm_head_ == embedding_; }
  // The score head (1, H). Reward head only.
  [[nodiscard]] std::int64_t score() const noexcept { return score_; }

  // The groups a backward pass completes one at a time, from the last to the first: the head
  // (final norm, then lm_head or score), each block from the last, the embedding. In layout
  // order, tiling [0, total()); a group begins where LlamaModel's gradient-ready hook reports
  // it. The tied lm_head is the embedding's group: written first, complete last.
  [[nodiscard]] std::vector<FlatRange> gradient_groups() const;

 private:
  std::int64_t add(std::string name, std::vector<std::int64_t> shape, bool decay);

  ModelConfig config_;
  HeadKind head_;
  std::vector<TensorInfo> tensors_;
  std::vector<BlockOffsets> blocks_;
  std::int64_t total_ = 0;
  std::int64_t embedding_ = 0;
  std::int64_t final_norm_ = 0;
  std::int64_t lm_head_ = -1;
  std::int64_t score_ = -1;
};

}  // namespace l3::model
