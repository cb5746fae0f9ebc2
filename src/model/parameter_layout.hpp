// Where every parameter lives in the one flat buffer: Hugging Face names, shapes ([out, in] for
// linear layers) and order. Gradients, optimizer moments and checkpoints use the same layout,
// so a ZeRO shard or a checkpoint slice is just a range of it.
//
// Two kinds: a model's layout (every weight), and the layout of what LoRA trains (the adapters
// of each block, in PEFT's names without its "base_model.model." prefix, and a reward model's
// score head beside them). Training (optimizer, data parallelism, checkpoints) works on the
// trainable layout, which is the model's own without LoRA.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/lora_config.hpp"
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
  bool operator==(const FlatRange&) const = default;
};

// Offsets of one decoder block's tensors.
struct BlockOffsets {
  std::int64_t input_norm, q_proj, k_proj, v_proj, o_proj, post_attention_norm, gate_proj, up_proj,
      down_proj;
};

// Offsets of one block's adapters in an adapter layout: A (r, in) and B (out, r) of each target,
// -1 for a layer without one.
struct AdapterOffsets {
  std::array<std::int64_t, kLoraTargetCount> a{-1, -1, -1, -1, -1, -1, -1};
  std::array<std::int64_t, kLoraTargetCount> b{-1, -1, -1, -1, -1, -1, -1};
};

// (out, in) of the linear layer an adapter target names.
[[nodiscard]] std::array<std::int64_t, 2> lora_target_shape(const ModelConfig& config,
                                                            LoraTarget t);

class ParameterLayout {
 public:
  // Tensors start at multiples of this many elements (aligned vector loads on every backend).
  static constexpr std::int64_t kAlignment = 64;

  // The model's weights.
  ParameterLayout(const ModelConfig& config, HeadKind head);
  // The LoRA adapters of `lora` (enabled) on a model of `config`, then, for a reward model, the
  // score head (trained in full beside them, PEFT's modules_to_save).
  ParameterLayout(const ModelConfig& config, HeadKind head, const LoraConfig& lora);

  // True for an adapter layout.
  [[nodiscard]] bool adapters() const noexcept { return lora_.enabled(); }
  [[nodiscard]] const LoraConfig& lora() const noexcept { return lora_; }
  // Adapter layouts only.
  [[nodiscard]] const AdapterOffsets& adapter(int layer) const {
    return adapter_blocks_.at(static_cast<std::size_t>(layer));
  }

  [[nodiscard]] const ModelConfig& config() const noexcept { return config_; }
  [[nodiscard]] HeadKind head() const noexcept { return head_; }
  [[nodiscard]] const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  // Elements in the flat buffer, alignment padding included (padding stays zero).
  [[nodiscard]] std::int64_t total() const noexcept { return total_; }
  // Sum of the tensors' elements, without padding.
  [[nodiscard]] std::int64_t parameter_count() const noexcept;
  // Throws an internal Error for an unknown name.
  [[nodiscard]] const TensorInfo& find(std::string_view name) const;
  // Null for an unknown name.
  [[nodiscard]] const TensorInfo* lookup(std::string_view name) const noexcept;

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
  // it. The tied lm_head is the embedding's group: written first, complete last. An adapter
  // layout's groups: each block's adapters, then the score head (reward).
  [[nodiscard]] std::vector<FlatRange> gradient_groups() const;

 private:
  std::int64_t add(std::string name, std::vector<std::int64_t> shape, bool decay);

  ModelConfig config_;
  HeadKind head_;
  LoraConfig lora_{};  // rank 0 for a model's layout
  std::vector<TensorInfo> tensors_;
  std::vector<BlockOffsets> blocks_;
  std::vector<AdapterOffsets> adapter_blocks_;
  std::vector<std::int64_t> group_starts_;  // where each gradient group begins, ascending
  std::int64_t total_ = 0;
  std::int64_t embedding_ = 0;
  std::int64_t final_norm_ = 0;
  std::int64_t lm_head_ = -1;
  std::int64_t score_ = -1;
};

}  // namespace l3::model
