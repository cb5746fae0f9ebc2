// --init from a Hugging Face model directory: tied embeddings when lm_head.weight is absent,
// every tensor read where the layout wants it, a missing or misshapen tensor refused with the
// directory and the tensor named; and export -> --init returns the weights bit for bit (fp32).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../support/catch.hpp"
#include "ckpt/hf_export.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/model_file.hpp"
#include "core/error.hpp"
#include "io/safetensors/safetensors_writer.hpp"
#include "model/parameter_layout.hpp"
#include "temp_dir.hpp"
#include "train/model_source.hpp"

namespace {

using l3::model::HeadKind;
using l3::model::ParameterLayout;

// A tiny untied Llama as a Hugging Face directory; `skip` is left out, `reshape` gets one
// more row.
std::vector<float> write_hf_model(const std::filesystem::path& dir, const std::string& skip,
                                  const std::string& reshape) {
  l3::model::ModelConfig config = l3::model::preset("tiny");
  config.tie_word_embeddings = false;
  const ParameterLayout layout(config, HeadKind::language_model);
  std::vector<float> flat(static_cast<std::size_t>(layout.total()), 0.0F);
  for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = 0.001F * static_cast<float>(i % 997);
  std::vector<std::vector<float>> reshaped;
  std::vector<l3::safetensors::TensorToWrite> tensors;
  for (const l3::model::TensorInfo& t : layout.tensors()) {
    if (t.name == skip) continue;
    std::span<const float> values(flat.data() + t.offset, static_cast<std::size_t>(t.numel));
    std::vector<std::int64_t> shape = t.shape;
    if (t.name == reshape) {
      shape[0] += 1;
      reshaped.emplace_back(static_cast<std::size_t>(t.numel + t.shape[1]), 0.5F);
      values = reshaped.back();
    }
    tensors.push_back({t.name, shape, values});
  }
  std::filesystem::create_directories(dir);
  l3::safetensors::write_safetensors((dir / "model.safetensors").string(), tensors,
                                     l3::safetensors::SafetensorsDType::f32, {});
  std::ofstream(dir / "config.json") << config.to_hf_json().dump();
  return flat;
}

}  // namespace

TEST_CASE("a Hugging Face model without lm_head.weight has tied embeddings", "[hf]") {
  const l3::test::TempDir dir;
  const std::vector<float> written = write_hf_model(dir.path() / "m", "lm_head.weight", "");
  const l3::train::ModelSource source =
      l3::train::resolve_model_source("", (dir.path() / "m").string());
  CHECK(source.config.tie_word_embeddings);
  CHECK(source.initial_head() == HeadKind::language_model);
  const ParameterLayout layout(source.config, HeadKind::language_model);
  std::vector<float> flat(static_cast<std::size_t>(layout.total()), -1.0F);
  l3::train::read_initial_weights(source, layout, flat);
  const l3::model::TensorInfo& embed = layout.find("model.embed_tokens.weight");
  CHECK(layout.lm_head() == embed.offset);
  l3::model::ModelConfig untied = l3::model::preset("tiny");
  untied.tie_word_embeddings = false;
  const ParameterLayout written_layout(untied, HeadKind::language_model);
  const auto written_embed = written_layout.find("model.embed_tokens.weight").offset;
  for (std::int64_t i = 0; i < embed.numel; i += 101) {
    CHECK(flat[static_cast<std::size_t>(embed.offset + i)] ==
          written[static_cast<std::size_t>(written_embed + i)]);
  }
}

TEST_CASE("a Hugging Face model with lm_head.weight stays untied and is read whole", "[hf]") {
  const l3::test::TempDir dir;
  const std::vector<float> written = write_hf_model(dir.path() / "m", "", "");
  const l3::train::ModelSource source =
      l3::train::resolve_model_source("", (dir.path() / "m").string());
  CHECK_FALSE(source.config.tie_word_embeddings);
  const ParameterLayout layout(source.config, HeadKind::language_model);
  std::vector<float> flat(static_cast<std::size_t>(layout.total()), -1.0F);
  l3::train::read_initial_weights(source, layout, flat);
  for (const l3::model::TensorInfo& t : layout.tensors()) {
    INFO(t.name);
    const auto at = static_cast<std::size_t>(t.offset);
    CHECK(std::equal(
        flat.begin() + static_cast<std::ptrdiff_t>(at),
        flat.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(t.numel)),
        written.begin() + static_cast<std::ptrdiff_t>(at)));
  }
}

TEST_CASE("a missing or misshapen tensor in a Hugging Face model is refused", "[hf]") {
  const l3::test::TempDir dir;
  write_hf_model(dir.path() / "missing", "model.layers.1.mlp.up_proj.weight", "");
  write_hf_model(dir.path() / "shape", "", "model.layers.0.self_attn.o_proj.weight");
  for (const auto& [name, expected] :
       {std::pair{"missing", "tensor 'model.layers.1.mlp.up_proj.weight': the model has no such"},
        std::pair{"shape", "tensor 'model.layers.0.self_attn.o_proj.weight': shape ["}}) {
    const l3::train::ModelSource source =
        l3::train::resolve_model_source("", (dir.path() / name).string());
    const ParameterLayout layout(source.config, HeadKind::language_model);
    std::vector<float> flat(static_cast<std::size_t>(layout.total()));
    CHECK_THROWS_WITH(l3::train::read_initial_weights(source, layout, flat),
                      Catch::Contains(expected) && Catch::Contains(name));
  }
}

TEST_CASE("export then --init gives back the checkpoint's weights bit for bit", "[hf]") {
  for (const HeadKind head : {HeadKind::language_model, HeadKind::reward}) {
    for (const bool tied : {true, false}) {
      if (head == HeadKind::reward && !tied) continue;  // a reward model has no lm_head
      INFO((head == HeadKind::reward ? "reward" : "language model") << (tied ? ", tied" : ""));
      const l3::test::TempDir dir;
      l3::model::ModelConfig config = l3::model::preset("tiny");
      config.tie_word_embeddings = tied;
      const ParameterLayout layout(config, head);
      std::vector<float> flat(static_cast<std::size_t>(layout.total()), 0.0F);
      for (const l3::model::TensorInfo& t : layout.tensors()) {
        for (std::int64_t i = 0; i < t.numel; ++i) {
          flat[static_cast<std::size_t>(t.offset + i)] =
              std::sin(0.37F * static_cast<float>(i + t.offset)) * 1e-2F;
        }
      }
      // A model-only checkpoint: manifest + model.h5.
      const std::filesystem::path step = dir.path() / "ck" / "step-00000007";
      std::filesystem::create_directories(step);
      l3::ckpt::write_model_file((step / "model.h5").string(), layout, flat);
      l3::ckpt::Manifest manifest;
      manifest.step = 7;
      manifest.phase = head == HeadKind::reward ? l3::Phase::reward : l3::Phase::sft;
      manifest.head = head;
      manifest.model = config;
      manifest.tokenizer = "bytes";
      std::ofstream(step / "manifest.json") << manifest.to_json().dump();

      const std::string out = (dir.path() / "hf").string();
      const l3::ckpt::HfExportReport report =
          l3::ckpt::export_hugging_face(step.string(), out, {.bf16 = false});
      CHECK(report.architecture ==
            (head == HeadKind::reward ? "LlamaForSequenceClassification" : "LlamaForCausalLM"));
      const l3::train::ModelSource source = l3::train::resolve_model_source("", out);
      CHECK(source.hf_head == head);
      CHECK(source.config.tie_word_embeddings == tied);
      l3::model::ModelConfig named = source.config;
      named.name = config.name;
      CHECK(named.to_hf_json() == config.to_hf_json());
      std::vector<float> back(flat.size(), -1.0F);
      l3::train::read_initial_weights(source, ParameterLayout(source.config, head), back);
      CHECK(std::memcmp(back.data(), flat.data(), flat.size() * sizeof(float)) == 0);
    }
  }
}
