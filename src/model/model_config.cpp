#include "model/model_config.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "core/bounded_read.hpp"
#include "core/error.hpp"

namespace l3::model {

using nlohmann::json;

namespace {

ModelConfig llama3_base(std::string name) {
  ModelConfig c;
  c.name = std::move(name);
  c.vocab_size = 128256;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  return c;
}

// The published configurations of Meta's models (their config.json on the Hugging Face hub).
ModelConfig make_preset(std::string_view name) {
  if (name == "llama3-8b" || name == "llama3.1-8b") {
    ModelConfig c = llama3_base(std::string(name));
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.n_layers = 32;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 8192;
    if (name == "llama3.1-8b") {
      c.max_position_embeddings = 131072;
      c.rope_scaling = {true, 8.0, 1.0, 4.0, 8192};
    }
    return c;
  }
  if (name == "llama3.2-1b") {
    ModelConfig c = llama3_base(std::string(name));
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.n_layers = 16;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 64;
    c.max_position_embeddings = 131072;
    c.rope_scaling = {true, 32.0, 1.0, 4.0, 8192};
    c.tie_word_embeddings = true;
    return c;
  }
  if (name == "llama3.2-3b") {
    ModelConfig c = llama3_base(std::string(name));
    c.hidden_size = 3072;
    c.intermediate_size = 8192;
    c.n_layers = 28;
    c.n_heads = 24;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 131072;
    c.rope_scaling = {true, 32.0, 1.0, 4.0, 8192};
    c.tie_word_embeddings = true;
    return c;
  }
  if (name == "llama3.1-70b") {
    ModelConfig c = llama3_base(std::string(name));
    c.hidden_size = 8192;
    c.intermediate_size = 28672;
    c.n_layers = 80;
    c.n_heads = 64;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 131072;
    c.rope_scaling = {true, 8.0, 1.0, 4.0, 8192};
    return c;
  }
  if (name == "llama3.1-405b") {
    ModelConfig c = llama3_base(std::string(name));
    c.hidden_size = 16384;
    c.intermediate_size = 53248;
    c.n_layers = 126;
    c.n_heads = 128;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 131072;
    c.rope_scaling = {true, 8.0, 1.0, 4.0, 8192};
    return c;
  }
  if (name == "tiny-llama3") {
    // The tiny model with Llama 3's vocabulary: data prepared with Meta's tokenizer.model
    // trains on a laptop (8.3M parameters, almost all of them the tied embedding).
    ModelConfig c = llama3_base(std::string(name));
    c.hidden_size = 64;
    c.intermediate_size = 192;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 2048;
    c.tie_word_embeddings = true;
    return c;
  }
  if (name == "tiny") {  // tests and demos: the vocabulary of the built-in `bytes` tokenizer
    ModelConfig c;
    c.name = "tiny";
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 192;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 2048;
    return c;
  }
  return {};
}

constexpr std::array kPresets = {"llama3-8b",    "llama3.1-8b",   "llama3.2-1b", "llama3.2-3b",
                                 "llama3.1-70b", "llama3.1-405b", "tiny",        "tiny-llama3"};

template <typename T>
T number(const json& config, const char* key, const std::string& origin) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    throw core::bad_input(fmt::format("missing \"{}\"", key), {.file = origin});
  }
  if (!it->is_number()) {
    throw core::bad_input(fmt::format("\"{}\" must be a number, not {}", key, it->dump()),
                          {.file = origin});
  }
  if constexpr (std::is_integral_v<T>) {
    // A whole number that fits: 64.5 is no layer width, 1e30 no layer count (nlohmann's get
    // would truncate or wrap them silently).
    const double value = it->get<double>();
    const bool whole = it->is_number_integer() || std::trunc(value) == value;
    const bool fits = value >= static_cast<double>(std::numeric_limits<T>::min()) &&
                      value <= static_cast<double>(std::numeric_limits<T>::max());
    if (!whole || !fits) {
      throw core::bad_input(
          fmt::format("\"{}\" must be a whole number in range, not {}", key, it->dump()),
          {.file = origin});
    }
    return it->is_number_integer() ? it->get<T>() : static_cast<T>(value);
  } else {
    const T value = it->get<T>();
    if (!std::isfinite(value)) {
      throw core::bad_input(fmt::format("\"{}\" must be a finite number", key), {.file = origin});
    }
    return value;
  }
}

template <typename T>
T number_or(const json& config, const char* key, T fallback, const std::string& origin) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  return number<T>(config, key, origin);
}

}  // namespace

void ModelConfig::validate() const {
  const auto fail = [&](const std::string& what) { throw core::bad_input(what, {.file = name}); };
  // Upper bounds far beyond any Llama (405B: hidden 16384, 126 layers, 131072 positions), so that
  // a mistyped number is named here instead of running the machine out of memory.
  const auto at_most = [&](std::int64_t value, std::int64_t limit, const char* key) {
    if (value > limit) {
      fail(fmt::format("{} {} is beyond any model this program trains (at most {})", key, value,
                       limit));
    }
  };
  if (vocab_size <= 0) fail(fmt::format("vocab_size must be positive (got {})", vocab_size));
  if (vocab_size > (1LL << 31)) fail(fmt::format("vocab_size {} exceeds 2^31", vocab_size));
  at_most(hidden_size, kMaxHiddenSize, "hidden_size");
  at_most(intermediate_size, kMaxIntermediateSize, "intermediate_size");
  at_most(n_layers, kMaxLayers, "num_hidden_layers");
  at_most(n_heads, kMaxHeads, "num_attention_heads");
  at_most(head_dim, kMaxHeadDim, "head_dim");
  at_most(max_position_embeddings, kMaxPositions, "max_position_embeddings");
  if (hidden_size <= 0) fail(fmt::format("hidden_size must be positive (got {})", hidden_size));
  if (intermediate_size <= 0) {
    fail(fmt::format("intermediate_size must be positive (got {})", intermediate_size));
  }
  if (n_layers <= 0) fail(fmt::format("num_hidden_layers must be positive (got {})", n_layers));
  if (n_heads <= 0) fail(fmt::format("num_attention_heads must be positive (got {})", n_heads));
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) {
    fail(fmt::format("num_attention_heads {} must be a multiple of num_key_value_heads {}", n_heads,
                     n_kv_heads));
  }
  if (head_dim <= 0 || head_dim % 2 != 0) {
    fail(fmt::format("head_dim must be positive and even for RoPE (got {})", head_dim));
  }
  if (static_cast<std::int64_t>(n_heads) * head_dim * tensor_slices != hidden_size) {
    fail(
        fmt::format("num_attention_heads {} x head_dim {} must equal hidden_size {} (hidden "
                    "size % heads must be 0)",
                    n_heads * tensor_slices, head_dim, hidden_size));
  }
  if (max_position_embeddings <= 0) {
    fail(fmt::format("max_position_embeddings must be positive (got {})", max_position_embeddings));
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta))
    fail(fmt::format("rope_theta must be positive and finite (got {})", rope_theta));
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps))
    fail(fmt::format("rms_norm_eps must be positive and finite (got {})", rms_norm_eps));
  // Counted in floating point: the bounds above keep every product in range, this the total.
  const double blocks =
      static_cast<double>(n_layers) *
      (4.0 * static_cast<double>(hidden_size) * static_cast<double>(hidden_size) +
       3.0 * static_cast<double>(hidden_size) * static_cast<double>(intermediate_size));
  const double parameters =
      blocks + 2.0 * static_cast<double>(vocab_size) * static_cast<double>(hidden_size);
  if (parameters > kMaxParameters) {
    fail(fmt::format("{:.3g} parameters is beyond any model this program trains (at most {:.0e})",
                     parameters, kMaxParameters));
  }
  if (rope_scaling.enabled) {
    const RopeScaling& s = rope_scaling;
    if (!(s.factor >= 1.0) || !std::isfinite(s.factor) || !std::isfinite(s.high_freq_factor))
      fail(fmt::format("rope_scaling.factor must be >= 1 (got {})", s.factor));
    if (!(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor)) {
      fail(fmt::format("rope_scaling needs 0 < low_freq_factor < high_freq_factor (got {} and {})",
                       s.low_freq_factor, s.high_freq_factor));
    }
    if (s.original_max_position_embeddings <= 0) {
      fail("rope_scaling.original_max_position_embeddings must be positive");
    }
  }
}

std::int64_t ModelConfig::block_parameters() const {
  const std::int64_t attention = 2 * hidden_size * q_size() + 2 * hidden_size * kv_size();
  const std::int64_t mlp = 3 * hidden_size * intermediate_size;
  return attention + mlp + 2 * hidden_size;
}

std::int64_t ModelConfig::parameter_count() const {
  return vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2) + n_layers * block_parameters() +
         hidden_size;
}

std::int64_t ModelConfig::flop_parameters(bool language_model_head) const {
  // A reward model's head is one hidden-size vector, not the (V, H) lm_head.
  return n_layers * block_parameters() + hidden_size +
         (language_model_head ? vocab_size : 1) * hidden_size;
}

double ModelConfig::training_flops_per_token(std::int64_t seq_len, bool language_model_head) const {
  return 6.0 * static_cast<double>(flop_parameters(language_model_head)) +
         12.0 * n_layers * static_cast<double>(hidden_size) * static_cast<double>(seq_len);
}

json ModelConfig::to_hf_json() const {
  json config = {{"architectures", json::array({"LlamaForCausalLM"})},
                 {"model_type", "llama"},
                 {"vocab_size", vocab_size},
                 {"hidden_size", hidden_size},
                 {"intermediate_size", intermediate_size},
                 {"num_hidden_layers", n_layers},
                 {"num_attention_heads", n_heads},
                 {"num_key_value_heads", n_kv_heads},
                 {"head_dim", head_dim},
                 {"max_position_embeddings", max_position_embeddings},
                 {"rope_theta", rope_theta},
                 {"rms_norm_eps", rms_norm_eps},
                 {"tie_word_embeddings", tie_word_embeddings},
                 {"hidden_act", "silu"},
                 {"attention_bias", false},
                 {"mlp_bias", false}};
  if (rope_scaling.enabled) {
    config["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  } else {
    config["rope_scaling"] = nullptr;
  }
  return config;
}

std::vector<std::string_view> preset_names() { return {kPresets.begin(), kPresets.end()}; }

ModelConfig preset(std::string_view name) {
  ModelConfig c = make_preset(name);
  if (c.hidden_size == 0) {
    std::string known;
    for (const char* p : kPresets) known += (known.empty() ? "" : ", ") + std::string(p);
    throw core::usage_error(
        fmt::format("unknown model preset '{}' (presets: {}; or give a "
                    "Hugging Face config.json or model directory)",
                    name, known));
  }
  c.validate();
  return c;
}

ModelConfig from_hf_config(const json& config, const std::string& origin) {
  if (!config.is_object())
    throw core::bad_input("config.json is not a JSON object", {.file = origin});
  if (const auto type = config.find("model_type");
      type != config.end() && type->is_string() && type->get<std::string>() != "llama") {
    throw core::bad_input(
        fmt::format(R"(model_type "{}" is not "llama")", type->get<std::string>()),
        {.file = origin});
  }
  ModelConfig c;
  c.name = origin;
  c.vocab_size = number<std::int64_t>(config, "vocab_size", origin);
  c.hidden_size = number<std::int64_t>(config, "hidden_size", origin);
  c.intermediate_size = number<std::int64_t>(config, "intermediate_size", origin);
  c.n_layers = number<int>(config, "num_hidden_layers", origin);
  c.n_heads = number<int>(config, "num_attention_heads", origin);
  c.n_kv_heads = number_or<int>(config, "num_key_value_heads", c.n_heads, origin);
  c.head_dim = number_or<int>(
      config, "head_dim", c.n_heads > 0 ? static_cast<int>(c.hidden_size / c.n_heads) : 0, origin);
  c.max_position_embeddings =
      number_or<std::int64_t>(config, "max_position_embeddings", 8192, origin);
  c.rope_theta = number_or<double>(config, "rope_theta", 10000.0, origin);
  c.rms_norm_eps = number_or<double>(config, "rms_norm_eps", 1e-6, origin);
  if (const auto tie = config.find("tie_word_embeddings"); tie != config.end() && !tie->is_null()) {
    if (!tie->is_boolean())
      throw core::bad_input("\"tie_word_embeddings\" must be true or false", {.file = origin});
    c.tie_word_embeddings = tie->get<bool>();
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (const auto bias = config.find(key);
        bias != config.end() && bias->is_boolean() && bias->get<bool>()) {
      throw core::bad_input(
          fmt::format("\"{}\": true is not supported (Llama 3 has no biases)", key),
          {.file = origin});
    }
  }
  if (const auto act = config.find("hidden_act");
      act != config.end() && act->is_string() && act->get<std::string>() != "silu") {
    throw core::bad_input(
        fmt::format("hidden_act \"{}\" is not supported (silu only)", act->get<std::string>()),
        {.file = origin});
  }

  if (const auto scaling = config.find("rope_scaling");
      scaling != config.end() && !scaling->is_null()) {
    if (!scaling->is_object())
      throw core::bad_input("\"rope_scaling\" must be an object or null", {.file = origin});
    std::string type;
    for (const char* key : {"rope_type", "type"}) {  // "type" is the older spelling
      if (const auto t = scaling->find(key); t != scaling->end() && t->is_string()) {
        type = t->get<std::string>();
        break;
      }
    }
    if (type == "llama3") {
      c.rope_scaling.enabled = true;
      c.rope_scaling.factor = number<double>(*scaling, "factor", origin + " rope_scaling");
      c.rope_scaling.low_freq_factor =
          number<double>(*scaling, "low_freq_factor", origin + " rope_scaling");
      c.rope_scaling.high_freq_factor =
          number<double>(*scaling, "high_freq_factor", origin + " rope_scaling");
      c.rope_scaling.original_max_position_embeddings = number<std::int64_t>(
          *scaling, "original_max_position_embeddings", origin + " rope_scaling");
    } else if (type != "default" && !type.empty()) {
      throw core::bad_input(
          fmt::format("rope_scaling type \"{}\" is not supported (llama3 or none)", type),
          {.file = origin});
    }
  }
  c.validate();
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  return from_hf_config(core::read_json_object(path, "a model config (config.json)"), path);
}

ModelConfig resolve_model(const std::string& preset_or_path) {
  namespace fs = std::filesystem;
  if (!make_preset(preset_or_path).name.empty()) return preset(preset_or_path);
  std::error_code ec;
  if (fs::is_directory(preset_or_path, ec)) {
    return load_hf_config((fs::path(preset_or_path) / "config.json").string());
  }
  if (fs::exists(preset_or_path, ec)) return load_hf_config(preset_or_path);
  return preset(preset_or_path);  // throws: unknown preset, listing the known ones
}

}  // namespace l3::model
