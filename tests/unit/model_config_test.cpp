#include "model/model_config.hpp"

#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "core/error.hpp"
#include "model/parameter_layout.hpp"
#include "temp_dir.hpp"

using l3::model::ModelConfig;
using nlohmann::json;

TEST_CASE("presets have the published parameter counts", "[model]") {
  CHECK(l3::model::preset("llama3-8b").parameter_count() == 8030261248LL);
  CHECK(l3::model::preset("llama3.1-8b").parameter_count() == 8030261248LL);
  CHECK(l3::model::preset("llama3.2-1b").parameter_count() == 1235814400LL);
  CHECK(l3::model::preset("llama3.2-3b").parameter_count() == 3212749824LL);
  CHECK(l3::model::preset("llama3.1-70b").parameter_count() == 70553706496LL);
  // 811,706,777,600 bytes of bf16 in the published checkpoint's index.
  CHECK(l3::model::preset("llama3.1-405b").parameter_count() == 405853388800LL);
  const ModelConfig tiny = l3::model::preset("tiny");
  CHECK(tiny.vocab_size == 512);
  CHECK(tiny.hidden_size == 64);
  CHECK(tiny.n_layers == 2);
  CHECK(tiny.n_heads == 4);
  CHECK(tiny.n_kv_heads == 2);
  CHECK(tiny.intermediate_size == 192);
  CHECK(tiny.max_position_embeddings == 2048);
  CHECK_FALSE(tiny.tie_word_embeddings);
  CHECK_FALSE(tiny.rope_scaling.enabled);
  CHECK(l3::model::preset("llama3.2-1b").tie_word_embeddings);
  CHECK(l3::model::preset("llama3.2-1b").rope_scaling.factor == 32.0);
  CHECK_THROWS_AS(l3::model::preset("llama2-7b"), l3::core::Error);
}

TEST_CASE("a Hugging Face config.json round-trips and is read like transformers", "[model]") {
  for (const auto* name : {"llama3.1-8b", "llama3.2-1b", "tiny"}) {
    const ModelConfig c = l3::model::preset(name);
    const ModelConfig back = l3::model::from_hf_config(c.to_hf_json(), "x/config.json");
    CHECK(back.parameter_count() == c.parameter_count());
    CHECK(back.rope_scaling.enabled == c.rope_scaling.enabled);
    CHECK(back.rope_scaling.factor == c.rope_scaling.factor);
    CHECK(back.tie_word_embeddings == c.tie_word_embeddings);
    CHECK(back.head_dim == c.head_dim);
  }
  // Meta's Llama-3.2-1B config.json (abridged), with the older "type" key for the scaling.
  const json meta = json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 128000,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "type": "llama3"},
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 128256})");
  const ModelConfig c = l3::model::from_hf_config(meta, "Llama-3.2-1B/config.json");
  CHECK(c.head_dim == 64);  // hidden / heads when head_dim is absent
  CHECK(c.parameter_count() == 1235814400LL);
  CHECK(c.rope_scaling.enabled);
  CHECK(c.rope_scaling.factor == 32.0);

  const l3::test::TempDir dir;
  const std::string path = dir.write("config.json", meta.dump());
  CHECK(l3::model::resolve_model(dir.path().string()).parameter_count() == 1235814400LL);
  CHECK(l3::model::resolve_model(path).n_layers == 16);
  CHECK(l3::model::resolve_model("tiny").n_layers == 2);
}

namespace {

// What reading `config` as "bad/config.json" throws (always a bad_input Error), or "no error".
std::string message(const json& config) {
  try {
    (void)l3::model::from_hf_config(config, "bad/config.json");
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::bad_input);
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("inconsistent configs are rejected with the reason", "[model]") {
  json good = l3::model::preset("tiny").to_hf_json();
  json c = good;
  c["num_key_value_heads"] = 3;
  CHECK(message(c).find("multiple of num_key_value_heads") != std::string::npos);
  c = good;
  c.erase("head_dim");
  c["num_attention_heads"] = 5;
  c["num_key_value_heads"] = 5;
  CHECK(message(c).find("hidden_size") != std::string::npos);
  c = good;
  c.erase("vocab_size");
  CHECK(message(c) == "bad/config.json: missing \"vocab_size\"");
  c = good;
  c["hidden_size"] = "64";
  CHECK(message(c).find("must be a number") != std::string::npos);
  c = good;
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK(message(c).find("yarn") != std::string::npos);
  c = good;
  c["model_type"] = "mistral";
  CHECK(message(c).find("mistral") != std::string::npos);
  c = good;
  c["head_dim"] = 15;
  c["num_attention_heads"] = 4;
  CHECK(message(c).find("even") != std::string::npos);
  CHECK_THROWS_AS(l3::model::load_hf_config("/nonexistent/config.json"), l3::core::Error);
}

TEST_CASE("config numbers are whole where they count and bounded far beyond any model", "[model]") {
  const json good = l3::model::preset("tiny").to_hf_json();
  const auto with = [&](const char* key, const json& value) {
    json c = good;
    c[key] = value;
    return message(c);
  };
  CHECK(with("hidden_size", 64.5).find("whole number") != std::string::npos);
  CHECK(with("hidden_size", 64.0) == "no error");  // a whole number written as a float
  CHECK(with("num_hidden_layers", 1e9).find("num_hidden_layers") != std::string::npos);
  CHECK(with("num_hidden_layers", 1e30).find("whole number in range") != std::string::npos);
  CHECK(with("num_hidden_layers", -3).find("positive") != std::string::npos);
  CHECK(with("max_position_embeddings", 1LL << 40).find("max_position_embeddings") !=
        std::string::npos);
  CHECK(with("intermediate_size", 1LL << 40).find("intermediate_size") != std::string::npos);
  CHECK(with("vocab_size", 1LL << 40).find("vocab_size") != std::string::npos);
  CHECK(with("rms_norm_eps", -1.0).find("rms_norm_eps") != std::string::npos);
  // Each field within its bound, the whole beyond any model: named as parameters.
  json big = good;
  big["hidden_size"] = 131072;
  big["num_attention_heads"] = 1024;
  big["num_key_value_heads"] = 1024;
  big["head_dim"] = 128;
  big["intermediate_size"] = 524288;
  big["num_hidden_layers"] = 2048;
  CHECK(message(big).find("parameters") != std::string::npos);
  // Every preset stays within the bounds.
  for (const std::string_view name : l3::model::preset_names()) {
    INFO(name);
    CHECK_NOTHROW(l3::model::preset(name).validate());
  }
  // A config.json that is not an object names its file.
  const l3::test::TempDir dir;
  const std::string array = dir.write("config.json", "[]");
  try {
    (void)l3::model::load_hf_config(array);
    FAIL("accepted []");
  } catch (const l3::core::Error& e) {
    CHECK(std::string(e.what()).find(array) != std::string::npos);
    CHECK(e.kind() == l3::core::ErrorKind::bad_input);
  }
  CHECK_THROWS_AS(l3::model::load_hf_config(dir.path().string()), l3::core::Error);  // a directory
}

TEST_CASE("parameter layout: Hugging Face names, order, shapes, alignment", "[model]") {
  const ModelConfig c = l3::model::preset("tiny");
  const l3::model::ParameterLayout lm(c, l3::model::HeadKind::language_model);
  const auto& t = lm.tensors();
  REQUIRE(t.size() == 1 + 2 * 9 + 1 + 1);
  CHECK(t.front().name == "model.embed_tokens.weight");
  CHECK(t[1].name == "model.layers.0.self_attn.q_proj.weight");
  CHECK(t[1].shape == std::vector<std::int64_t>{64, 64});
  CHECK(lm.find("model.layers.1.self_attn.k_proj.weight").shape ==
        std::vector<std::int64_t>{32, 64});
  CHECK(lm.find("model.layers.1.mlp.down_proj.weight").shape == std::vector<std::int64_t>{64, 192});
  CHECK(t.back().name == "lm_head.weight");
  CHECK(lm.parameter_count() == c.parameter_count());
  for (const auto& info : t) {
    CHECK(info.offset % l3::model::ParameterLayout::kAlignment == 0);
    CHECK(info.decay == (info.shape.size() == 2));
  }
  for (std::size_t i = 1; i < t.size(); ++i) CHECK(t[i].offset >= t[i - 1].offset + t[i - 1].numel);

  ModelConfig tied = c;
  tied.tie_word_embeddings = true;
  const l3::model::ParameterLayout tl(tied, l3::model::HeadKind::language_model);
  CHECK(tl.lm_head() == tl.embedding());
  CHECK(tl.parameter_count() == tied.parameter_count());

  const l3::model::ParameterLayout rm(c, l3::model::HeadKind::reward);
  CHECK(rm.tensors().back().name == "score.weight");
  CHECK(rm.tensors().back().shape == std::vector<std::int64_t>{1, 64});
  CHECK(rm.lm_head() < 0);
}

TEST_CASE("PaLM FLOPs per token count the head the model has", "[model]") {
  const ModelConfig c = l3::model::preset("llama3-8b");
  // 8.03B parameters of which the input embedding (V x H = 525M) is a lookup, not a matmul.
  const std::int64_t lm = c.flop_parameters(true);
  CHECK(lm == c.parameter_count() - c.vocab_size * c.hidden_size);
  // A reward model's score head is one H vector instead of the (V, H) lm_head.
  CHECK(lm - c.flop_parameters(false) == (c.vocab_size - 1) * c.hidden_size);
  const double per_token = c.training_flops_per_token(8192, true);
  CHECK(per_token == 6.0 * static_cast<double>(lm) + 12.0 * 32 * 4096 * 8192);
  CHECK(c.training_flops_per_token(8192, false) < per_token);
}
