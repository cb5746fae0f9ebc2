#include "model/parameter_layout.hpp"

#include <fmt/format.h>

#include <numeric>

#include "core/error.hpp"

namespace l3::model {

ParameterLayout::ParameterLayout(const ModelConfig& config, HeadKind head)
    : config_(config), head_(head) {
  config_.validate();
  const std::int64_t h = config.hidden_size;
  const std::int64_t i = config.intermediate_size;
  embedding_ = add("model.embed_tokens.weight", {config.vocab_size, h}, true);
  for (int l = 0; l < config.n_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    BlockOffsets b{};
    // Hugging Face's module order: self_attn, mlp, then the two norms.
    b.q_proj = add(p + "self_attn.q_proj.weight", {config.q_size(), h}, true);
    b.k_proj = add(p + "self_attn.k_proj.weight", {config.kv_size(), h}, true);
    b.v_proj = add(p + "self_attn.v_proj.weight", {config.kv_size(), h}, true);
    b.o_proj = add(p + "self_attn.o_proj.weight", {h, config.q_size()}, true);
    b.gate_proj = add(p + "mlp.gate_proj.weight", {i, h}, true);
    b.up_proj = add(p + "mlp.up_proj.weight", {i, h}, true);
    b.down_proj = add(p + "mlp.down_proj.weight", {h, i}, true);
    b.input_norm = add(p + "input_layernorm.weight", {h}, false);
    b.post_attention_norm = add(p + "post_attention_layernorm.weight", {h}, false);
    blocks_.push_back(b);
  }
  final_norm_ = add("model.norm.weight", {h}, false);
  if (head == HeadKind::language_model) {
    lm_head_ = config.tie_word_embeddings ? embedding_
                                          : add("lm_head.weight", {config.vocab_size, h}, true);
  } else {
    score_ = add("score.weight", {1, h}, true);
  }
  group_starts_.push_back(embedding_);
  for (const BlockOffsets& b : blocks_) group_starts_.push_back(b.q_proj);  // a block's first
  group_starts_.push_back(final_norm_);
}

ParameterLayout::ParameterLayout(const ModelConfig& config, HeadKind head, const LoraConfig& lora)
    : config_(config), head_(head), lora_(lora) {
  config_.validate();
  lora_.validate();
  if (!lora_.enabled()) throw core::internal_error("an adapter layout of LoRA rank 0");
  const std::int64_t r = lora_.rank;
  const std::int64_t h = config.hidden_size;
  for (int l = 0; l < config.n_layers; ++l) {
    AdapterOffsets offsets;
    const std::size_t first = tensors_.size();
    for (const LoraTarget t : kLoraTargets) {
      if (!lora_.targets_layer(t)) continue;
      const auto k = static_cast<std::size_t>(t);
      const auto [out, in] = lora_target_shape(config, t);
      const std::string p = fmt::format("model.layers.{}.{}.", l, lora_target_module(t));
      offsets.a[k] = add(p + "lora_A.weight", {r, in}, true);
      offsets.b[k] = add(p + "lora_B.weight", {out, r}, true);
    }
    group_starts_.push_back(tensors_[first].offset);
    adapter_blocks_.push_back(offsets);
  }
  if (head == HeadKind::reward) {
    score_ = add("score.weight", {1, h}, true);
    group_starts_.push_back(score_);
  }
}

std::int64_t ParameterLayout::add(std::string name, std::vector<std::int64_t> shape, bool decay) {
  const std::int64_t numel =
      std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  const std::int64_t offset = (total_ + kAlignment - 1) / kAlignment * kAlignment;
  tensors_.push_back({std::move(name), std::move(shape), offset, numel, decay});
  total_ = offset + numel;
  return offset;
}

std::vector<FlatRange> ParameterLayout::gradient_groups() const {
  const std::vector<std::int64_t>& starts = group_starts_;
  std::vector<FlatRange> groups;
  for (std::size_t g = 0; g < starts.size(); ++g)
    groups.push_back({starts[g], g + 1 < starts.size() ? starts[g + 1] : total_});
  return groups;
}

std::int64_t ParameterLayout::parameter_count() const noexcept {
  std::int64_t count = 0;
  for (const TensorInfo& t : tensors_) count += t.numel;
  return count;
}

const TensorInfo* ParameterLayout::lookup(std::string_view name) const noexcept {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::array<std::int64_t, 2> lora_target_shape(const ModelConfig& c, LoraTarget t) {
  const std::int64_t h = c.hidden_size;
  switch (t) {
    case LoraTarget::q:
      return {c.q_size(), h};
    case LoraTarget::k:
    case LoraTarget::v:
      return {c.kv_size(), h};
    case LoraTarget::o:
      return {h, c.q_size()};
    case LoraTarget::gate:
    case LoraTarget::up:
      return {c.intermediate_size, h};
    case LoraTarget::down:
      return {h, c.intermediate_size};
  }
  throw core::internal_error("an unknown LoRA target");
}

const TensorInfo& ParameterLayout::find(std::string_view name) const {
  if (const TensorInfo* t = lookup(name)) return *t;
  throw core::internal_error(fmt::format("no parameter named '{}' in {}", name, config_.name));
}

}  // namespace l3::model
