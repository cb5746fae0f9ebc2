// LoRA adapters as Hugging Face PEFT stores them, so that `PeftModel.from_pretrained(base, DIR)`
// loads ours and we load PEFT's: DIR/adapter_config.json (LoraConfig's fields) and
// DIR/adapter_model.safetensors, whose tensors are the adapter layout's
// (model/parameter_layout.hpp) under PEFT's prefix:
// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" (A (r, in), B (out, r)), and for
// a reward model (task SEQ_CLS) "base_model.model.score.weight", the score head PEFT saves beside
// the adapters (modules_to_save). Names and fields follow PEFT's own source
// (peft/utils/save_and_load.py, peft/tuners/lora/config.py).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "model/lora_config.hpp"
#include "model/lora_merge.hpp"
#include "model/parameter_layout.hpp"

namespace l3::ckpt {

inline constexpr const char* kPeftTensorPrefix = "base_model.model.";

// What adapter_config.json says that the model needs.
struct PeftAdapterConfig {
  model::LoraConfig lora;
  model::HeadKind head = model::HeadKind::language_model;  // task_type CAUSAL_LM or SEQ_CLS
  std::string base_model;  // base_model_name_or_path; empty when null
};

struct PeftWriteOptions {
  bool bf16 = false;       // the tensors as BF16, else F32 (bit for bit; PEFT's own default)
  bool overwrite = false;  // replace an existing LoRA adapter directory
  std::string base_model;  // base_model_name_or_path; empty: null
};

// Writes `values` (laid out by `adapters`, an adapter layout) as a PEFT adapter directory,
// built in a staging directory and renamed into place. usage Error when the directory exists
// (without overwrite), bad_input when what exists is not a LoRA adapter.
void write_peft_adapter(const std::string& directory, const model::ParameterLayout& adapters,
                        std::span<const float> values, const PeftWriteOptions& options);

// adapter_config.json of `directory`. bad_input Errors name the file and the field for what is
// not LoRA as this model computes it: DoRA, per-module ranks or alphas, a subset of layers,
// biases, fan_in_fan_out, targets other than the projections q, k, v, o, gate, up and down, a
// task other than CAUSAL_LM or SEQ_CLS.
[[nodiscard]] PeftAdapterConfig read_peft_adapter_config(const std::string& directory);

// The tensors of `directory` as values laid out by `adapters`, whose LoRA settings must be the
// directory's config (read_peft_adapter_config). bad_input Errors name the file and the tensor:
// one missing, one of another shape (another rank), one the layout has no place for (a layer
// the config does not target, or a module this model does not adapt).
[[nodiscard]] std::vector<float> read_peft_adapter(const std::string& directory,
                                                   const model::ParameterLayout& adapters);

// The adapter of `directory` for a model of `layout` (a model's layout), ready to be folded into
// its weights, after the checks of read_peft_adapter_config and read_peft_adapter. A language
// model takes CAUSAL_LM adapters, a reward model SEQ_CLS ones (whose score head replaces the
// model's): a bad_input Error naming the adapter's config otherwise.
struct PeftAdapter {
  PeftAdapterConfig config;
  model::AdapterFold fold;
};
[[nodiscard]] PeftAdapter load_peft_adapter(const std::string& directory,
                                            const model::ParameterLayout& layout);

// The adapter of `directory` folded into `weights` (laid out by `layout`, a model's layout, fp32;
// model/lora_merge.hpp), after the checks of read_peft_adapter_config and read_peft_adapter. A
// language model takes CAUSAL_LM adapters, a reward model SEQ_CLS ones (whose score head
// replaces the model's): a bad_input Error naming the adapter's config otherwise. Returns the
// config.
PeftAdapterConfig apply_peft_adapter(const std::string& directory,
                                     const model::ParameterLayout& layout,
                                     std::span<float> weights);

// "a CAUSAL_LM adapter (language model)" or "a SEQ_CLS adapter (reward model)", for messages.
[[nodiscard]] std::string adapter_kind(model::HeadKind head);

}  // namespace l3::ckpt
