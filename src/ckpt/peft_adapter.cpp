#include "ckpt/peft_adapter.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/bounded_read.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/path_safety.hpp"
#include "io/safetensors/safetensors_file.hpp"
#include "io/safetensors/safetensors_writer.hpp"
#include "model/lora_merge.hpp"

namespace l3::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kTensorFile = "adapter_model.safetensors";

// PEFT's module name of a target ("q_proj").
std::string module_name(model::LoraTarget t) {
  const std::string_view path = model::lora_target_module(t);
  return std::string(path.substr(path.find('.') + 1));
}

// A number as PEFT writes it: an integer when it is one.
json number(double value) {
  if (std::floor(value) == value && std::abs(value) < 1e15) return static_cast<std::int64_t>(value);
  return value;
}

json config_json(const model::ParameterLayout& adapters, const PeftWriteOptions& options) {
  const model::LoraConfig& lora = adapters.lora();
  const bool reward = adapters.head() == model::HeadKind::reward;
  json targets = json::array();
  for (const model::LoraTarget t : model::kLoraTargets) {
    if (lora.targets_layer(t)) targets.push_back(module_name(t));
  }
  // LoraConfig's fields that PEFT has written since 0.9 (an older or newer PEFT reads them all;
  // one it does not know would be refused by PEFT up to 0.13), with PEFT's defaults where this
  // model has no choice. nlohmann's objects keep their keys sorted, as PEFT's json.dumps does.
  return {{"alpha_pattern", json::object()},
          {"auto_mapping", nullptr},
          {"base_model_name_or_path",
           options.base_model.empty() ? json(nullptr) : json(options.base_model)},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"layers_pattern", nullptr},
          {"layers_to_transform", nullptr},
          {"loftq_config", json::object()},
          {"lora_alpha", number(lora.alpha)},
          {"lora_dropout", lora.dropout},
          {"megatron_config", nullptr},
          {"megatron_core", "megatron.core"},
          // PeftModelForSequenceClassification adds both names; Llama's head is "score".
          {"modules_to_save", reward ? json::array({"classifier", "score"}) : json(nullptr)},
          {"peft_type", "LORA"},
          {"r", lora.rank},
          {"rank_pattern", json::object()},
          {"revision", nullptr},
          {"target_modules", targets},
          {"task_type", reward ? "SEQ_CLS" : "CAUSAL_LM"},
          {"use_dora", false},
          {"use_rslora", lora.rslora}};
}

// The field's value when present and not null.
const json* field(const json& config, const char* name) {
  const auto it = config.find(name);
  return it == config.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void refuse(const std::string& file, const std::string& why) {
  throw core::bad_input(why, {.file = file});
}

// The target mask of target_modules (PEFT: a list of module names matched at the end of a
// module's path, the string "all-linear", or a regular expression).
std::uint8_t targets_of(const std::string& file, const json* modules) {
  if (modules == nullptr) {  // PEFT's default for Llama
    return model::parse_lora_targets("q_proj,v_proj");
  }
  if (modules->is_string()) {
    if (modules->get<std::string>() == "all-linear") return 0x7F;  // every projection
    refuse(file, fmt::format("target_modules {} is a regular expression; list the modules "
                             "(q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                             modules->dump()));
  }
  if (!modules->is_array() || modules->empty())
    refuse(file, "target_modules must be a list of module names");
  std::uint8_t mask = 0;
  for (const json& entry : *modules) {
    if (!entry.is_string()) refuse(file, fmt::format("target_modules holds {}", entry.dump()));
    // "up_proj" or "mlp.up_proj" match every layer's; a longer path names some layers only.
    const std::string name = entry.get<std::string>();
    bool known = false;
    for (const model::LoraTarget t : model::kLoraTargets) {
      if (name == module_name(t) || name == model::lora_target_module(t)) {
        mask = static_cast<std::uint8_t>(mask | (1U << static_cast<unsigned>(t)));
        known = true;
      }
    }
    if (!known) {
      refuse(file, fmt::format("target_modules names '{}': this model adapts every layer's "
                               "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj or down_proj, "
                               "nothing else",
                               name));
    }
  }
  return mask;
}

bool empty_or_null(const json* value) {
  return value == nullptr || (value->is_object() && value->empty()) ||
         (value->is_array() && value->empty());
}

}  // namespace

void write_peft_adapter(const std::string& directory, const model::ParameterLayout& adapters,
                        std::span<const float> values, const PeftWriteOptions& options) {
  if (!adapters.adapters()) throw core::internal_error("write_peft_adapter: not an adapter layout");
  if (static_cast<std::int64_t>(values.size()) != adapters.total()) {
    throw core::internal_error(fmt::format("write_peft_adapter: {} values for a layout of {}",
                                           values.size(), adapters.total()));
  }
  const fs::path out = core::replaceable_output("--output", directory,
                                                core::OwnedKind::peft_adapter, options.overwrite);
  core::StagingDirectory staging(out, core::OwnedKind::peft_adapter, "--output");
  std::vector<safetensors::TensorToWrite> tensors;
  for (const model::TensorInfo& t : adapters.tensors()) {
    tensors.push_back({.name = kPeftTensorPrefix + t.name,
                       .shape = t.shape,
                       .values = values.subspan(static_cast<std::size_t>(t.offset),
                                                static_cast<std::size_t>(t.numel))});
  }
  safetensors::write_safetensors(
      (staging.path() / kTensorFile).string(), tensors,
      options.bf16 ? safetensors::SafetensorsDType::bf16 : safetensors::SafetensorsDType::f32,
      {{"format", "pt"}, {core::kAdapterMetadataKey, "export --adapter"}});
  core::write_file_atomically((staging.path() / kConfigFile).string(),
                              config_json(adapters, options).dump(2) + "\n");
  core::fsync_path(staging.path().string());
  staging.install(options.overwrite);
}

PeftAdapterConfig read_peft_adapter_config(const std::string& directory) {
  const std::string file = (fs::path(directory) / kConfigFile).string();
  const json config = core::read_json_object(file, "a PEFT adapter config");
  const auto string_of = [&](const char* name, const std::string& otherwise) {
    const json* value = field(config, name);
    if (value == nullptr) return otherwise;
    if (!value->is_string()) refuse(file, fmt::format("{} must be a string", name));
    return value->get<std::string>();
  };
  const auto number_of = [&](const char* name, double otherwise) {
    const json* value = field(config, name);
    if (value == nullptr) return otherwise;
    if (!value->is_number()) refuse(file, fmt::format("{} must be a number", name));
    return value->get<double>();
  };
  const auto flag_of = [&](const char* name) {
    const json* value = field(config, name);
    if (value != nullptr && !value->is_boolean())
      refuse(file, fmt::format("{} must be true or false", name));
    return value != nullptr && value->get<bool>();
  };

  if (const std::string type = string_of("peft_type", ""); type != "LORA") {
    refuse(file, fmt::format("peft_type is {}: only LoRA adapters (\"LORA\") are supported",
                             type.empty() ? "missing" : "\"" + type + "\""));
  }
  PeftAdapterConfig out;
  const json* rank = field(config, "r");
  if (rank == nullptr || !rank->is_number_integer() || rank->get<std::int64_t>() <= 0 ||
      rank->get<std::int64_t>() > 65536) {
    refuse(file, fmt::format("r must be a whole number from 1 to 65536, not {}",
                             rank == nullptr ? "missing" : rank->dump()));
  }
  out.lora.rank = static_cast<int>(rank->get<std::int64_t>());
  // The same domains as --lora-alpha and --lora-dropout: a file is no more trusted than an option.
  out.lora.alpha = number_of("lora_alpha", 8.0);
  if (!(out.lora.alpha > 0 && out.lora.alpha <= model::LoraConfig::kMaxAlpha)) {
    refuse(file, fmt::format("lora_alpha {} is outside (0, {:g}]", config.at("lora_alpha").dump(),
                             model::LoraConfig::kMaxAlpha));
  }
  out.lora.dropout = number_of("lora_dropout", 0.0);
  if (!(out.lora.dropout >= 0 && out.lora.dropout < 1)) {
    refuse(file,
           fmt::format("lora_dropout {} is outside [0, 1)", config.at("lora_dropout").dump()));
  }
  out.lora.rslora = flag_of("use_rslora");
  out.lora.targets = targets_of(file, field(config, "target_modules"));
  // What this model does not compute refuses the adapter rather than changing what it means.
  if (flag_of("use_dora")) refuse(file, "use_dora: DoRA adapters are not supported");
  if (flag_of("fan_in_fan_out")) refuse(file, "fan_in_fan_out: Llama's layers are not Conv1D");
  if (flag_of("lora_bias")) refuse(file, "lora_bias: adapters with biases are not supported");
  if (const std::string bias = string_of("bias", "none"); bias != "none")
    refuse(file, fmt::format("bias \"{}\": only \"none\" is supported", bias));
  for (const char* name : {"rank_pattern", "alpha_pattern", "layers_to_transform",
                           "layer_replication", "layers_pattern"}) {
    if (!empty_or_null(field(config, name))) {
      refuse(file, fmt::format("{} {}: every layer's adapters must share r and lora_alpha", name,
                               field(config, name)->dump()));
    }
  }
  const std::string task = string_of("task_type", "CAUSAL_LM");
  if (task == "SEQ_CLS") {
    out.head = model::HeadKind::reward;
  } else if (task != "CAUSAL_LM") {
    refuse(file, fmt::format("task_type \"{}\": CAUSAL_LM (SFT) or SEQ_CLS (reward) adapters "
                             "only",
                             task));
  }
  if (const json* saved = field(config, "modules_to_save"); !empty_or_null(saved)) {
    for (const json& name : *saved) {
      const bool head = name.is_string() && (name.get<std::string>() == "score" ||
                                             name.get<std::string>() == "classifier");
      if (!head || out.head != model::HeadKind::reward) {
        refuse(file, fmt::format("modules_to_save {}: only a reward model's score head is "
                                 "trained in full beside the adapters",
                                 saved->dump()));
      }
    }
  }
  out.base_model = string_of("base_model_name_or_path", "");
  try {
    out.lora.validate();
  } catch (const core::Error& e) {
    refuse(file, e.message());
  }
  return out;
}

std::vector<float> read_peft_adapter(const std::string& directory,
                                     const model::ParameterLayout& adapters) {
  if (!adapters.adapters()) throw core::internal_error("read_peft_adapter: not an adapter layout");
  const std::string path = (fs::path(directory) / kTensorFile).string();
  const safetensors::SafetensorsFile file(path);
  std::vector<float> values(static_cast<std::size_t>(adapters.total()), 0.0F);
  std::set<std::string> expected;
  for (const model::TensorInfo& t : adapters.tensors()) {
    const std::string name = kPeftTensorPrefix + t.name;
    expected.insert(name);
    const safetensors::SafetensorsTensor* stored = file.header().find(name);
    if (stored == nullptr) {
      throw core::bad_input(fmt::format("missing (adapter_config.json targets {} with r = {})",
                                        adapters.lora().targets_text(), adapters.lora().rank),
                            {.file = path, .tensor = name});
    }
    if (stored->shape != t.shape) {
      throw core::bad_input(
          fmt::format("has shape [{}], expected [{}] (r = {})", fmt::join(stored->shape, ", "),
                      fmt::join(t.shape, ", "), adapters.lora().rank),
          {.file = path, .tensor = name});
    }
    const std::span<float> read = std::span<float>(values).subspan(
        static_cast<std::size_t>(t.offset), static_cast<std::size_t>(t.numel));
    file.read(name, read);
    if (const auto bad = std::ranges::find_if(read, [](float v) { return !std::isfinite(v); });
        bad != read.end()) {
      throw core::bad_input(
          fmt::format("element {} is {}: adapter weights must be finite", bad - read.begin(), *bad),
          {.file = path, .tensor = name});
    }
  }
  for (const safetensors::SafetensorsTensor& t : file.header().tensors) {
    if (!expected.contains(t.name)) {
      throw core::bad_input(
          "not a tensor of this adapter: a layer adapter_config.json does not target, a module "
          "this model does not adapt, or a score head of another task",
          {.file = path, .tensor = t.name});
    }
  }
  return values;
}

std::string adapter_kind(model::HeadKind head) {
  return head == model::HeadKind::reward ? "a SEQ_CLS adapter (reward model)"
                                         : "a CAUSAL_LM adapter (language model)";
}

PeftAdapter load_peft_adapter(const std::string& directory, const model::ParameterLayout& layout) {
  PeftAdapterConfig config = read_peft_adapter_config(directory);
  if (config.head != layout.head()) {
    throw core::bad_input(fmt::format("{} holds {}; this model needs {}", directory,
                                      adapter_kind(config.head), adapter_kind(layout.head())),
                          {.file = (fs::path(directory) / kConfigFile).string()});
  }
  model::ParameterLayout adapters(layout.config(), layout.head(), config.lora);
  std::vector<float> values = read_peft_adapter(directory, adapters);
  return {.config = std::move(config),
          .fold = model::AdapterFold(layout, std::move(adapters), std::move(values))};
}

PeftAdapterConfig apply_peft_adapter(const std::string& directory,
                                     const model::ParameterLayout& layout,
                                     std::span<float> weights) {
  const PeftAdapter adapter = load_peft_adapter(directory, layout);
  for (const model::TensorInfo& t : layout.tensors()) {
    adapter.fold.apply(
        t, 0,
        weights.subspan(static_cast<std::size_t>(t.offset), static_cast<std::size_t>(t.numel)));
  }
  return adapter.config;
}

}  // namespace l3::ckpt
