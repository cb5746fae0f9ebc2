// LoRA adapters in PEFT's directory format (ckpt/peft_adapter.hpp): what we write has PEFT's
// tensor names, shapes and config fields and reads back bit for bit; a directory with a missing
// tensor, another rank or a foreign target is refused naming the file and the tensor.
#include "ckpt/peft_adapter.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "core/error.hpp"
#include "io/safetensors/float_formats.hpp"
#include "io/safetensors/safetensors_file.hpp"
#include "io/safetensors/safetensors_writer.hpp"
#include "numeric_support.hpp"
#include "temp_dir.hpp"

using l3::ckpt::PeftWriteOptions;
using l3::model::HeadKind;
using l3::model::LoraConfig;
using l3::model::ParameterLayout;

namespace {

LoraConfig lora_of(int rank, double alpha, std::string_view targets) {
  LoraConfig lora;
  lora.rank = rank;
  lora.alpha = alpha;
  lora.targets = l3::model::parse_lora_targets(targets);
  return lora;
}

std::vector<float> random_values(const ParameterLayout& layout, std::uint32_t stream) {
  l3::test::Random rnd(stream);
  std::vector<float> values(static_cast<std::size_t>(layout.total()), 0.0F);
  for (const auto& t : layout.tensors()) {
    const auto v = rnd.normal(static_cast<std::size_t>(t.numel));
    std::copy(v.begin(), v.end(), values.begin() + t.offset);
  }
  return values;
}

nlohmann::json read_json(const std::filesystem::path& file) {
  return nlohmann::json::parse(std::ifstream(file));
}

// A copy of `from`'s adapter directory at `to`, with its config edited and/or its tensors
// filtered and added.
void rewrite(const std::filesystem::path& from, const std::filesystem::path& to,
             const std::function<void(nlohmann::json&)>& edit_config,
             const std::function<bool(const std::string&)>& keep_tensor,
             const std::vector<l3::safetensors::TensorToWrite>& extra = {}) {
  std::filesystem::create_directories(to);
  nlohmann::json config = read_json(from / "adapter_config.json");
  edit_config(config);
  std::ofstream(to / "adapter_config.json") << config.dump(2);
  const l3::safetensors::SafetensorsFile file((from / "adapter_model.safetensors").string());
  std::vector<std::vector<float>> storage;
  std::vector<l3::safetensors::TensorToWrite> tensors;
  for (const auto& t : file.header().tensors) {
    if (!keep_tensor(t.name)) continue;
    storage.emplace_back(static_cast<std::size_t>(t.numel()));
    file.read(t.name, storage.back());
  }
  std::size_t i = 0;
  for (const auto& t : file.header().tensors) {
    if (keep_tensor(t.name))
      tensors.push_back({.name = t.name, .shape = t.shape, .values = storage[i++]});
  }
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  l3::safetensors::write_safetensors((to / "adapter_model.safetensors").string(), tensors,
                                     l3::safetensors::SafetensorsDType::f32, {{"format", "pt"}});
}

}  // namespace

TEST_CASE("a LoRA adapter written for PEFT reads back bit for bit, with PEFT's names and fields",
          "[ckpt][lora]") {
  INFO("seed " << l3::test::test_seed());
  const l3::test::TempDir tmp;
  const auto config = l3::model::preset("tiny");
  for (const HeadKind head : {HeadKind::language_model, HeadKind::reward}) {
    const bool reward = head == HeadKind::reward;
    INFO("reward " << reward);
    LoraConfig lora = lora_of(4, 16.0, "q,v,down");
    lora.dropout = 0.05;
    lora.rslora = reward;
    const ParameterLayout layout(config, head, lora);
    const auto values = random_values(layout, 50);
    const auto dir = tmp.path() / (reward ? "reward" : "sft");
    l3::ckpt::write_peft_adapter(dir.string(), layout, values,
                                 {.bf16 = false, .overwrite = false, .base_model = "/models/base"});

    const nlohmann::json json = read_json(dir / "adapter_config.json");
    CHECK(json.at("peft_type") == "LORA");
    CHECK(json.at("task_type") == (reward ? "SEQ_CLS" : "CAUSAL_LM"));
    CHECK(json.at("r") == 4);
    CHECK(json.at("lora_alpha").is_number_integer());
    CHECK(json.at("lora_alpha") == 16);
    CHECK(json.at("lora_dropout") == Approx(0.05));
    CHECK(json.at("use_rslora") == reward);
    CHECK(json.at("target_modules") == nlohmann::json({"q_proj", "v_proj", "down_proj"}));
    CHECK(json.at("bias") == "none");
    CHECK(json.at("base_model_name_or_path") == "/models/base");
    CHECK(json.at("modules_to_save") ==
          (reward ? nlohmann::json({"classifier", "score"}) : nlohmann::json(nullptr)));

    const l3::safetensors::SafetensorsFile file((dir / "adapter_model.safetensors").string());
    // PEFT's "format", and the key that proves the directory ours (core/path_safety.hpp).
    CHECK(file.header().metadata ==
          std::map<std::string, std::string>{{"format", "pt"}, {"llama3_hpc", "export --adapter"}});
    const auto* a =
        file.header().find("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
    REQUIRE(a != nullptr);
    CHECK(a->shape == std::vector<std::int64_t>{4, config.hidden_size});
    const auto* b =
        file.header().find("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
    REQUIRE(b != nullptr);
    CHECK(b->shape == std::vector<std::int64_t>{config.hidden_size, 4});
    CHECK((file.header().find("base_model.model.score.weight") != nullptr) == reward);
    CHECK(file.header().tensors.size() == layout.tensors().size());

    const l3::ckpt::PeftAdapterConfig read = l3::ckpt::read_peft_adapter_config(dir.string());
    CHECK(read.lora.rank == 4);
    CHECK(read.lora.alpha == 16.0);
    CHECK(read.lora.rslora == reward);
    CHECK(read.lora.targets == lora.targets);
    CHECK(read.head == head);
    CHECK(read.base_model == "/models/base");
    const ParameterLayout from_config(config, read.head, read.lora);
    CHECK(l3::ckpt::read_peft_adapter(dir.string(), from_config) == values);

    // BF16 tensors: the values rounded to nearest even
    const auto bf16_dir = tmp.path() / (reward ? "reward-bf16" : "sft-bf16");
    l3::ckpt::write_peft_adapter(bf16_dir.string(), layout, values, {.bf16 = true});
    const auto rounded = l3::ckpt::read_peft_adapter(bf16_dir.string(), layout);
    for (std::size_t i = 0; i < values.size(); ++i) {
      REQUIRE(rounded[i] ==
              l3::safetensors::bf16_to_float(l3::safetensors::float_to_bf16(values[i])));
    }
  }
}

TEST_CASE("a PEFT adapter that does not fit is refused naming the file and the tensor",
          "[ckpt][lora]") {
  const l3::test::TempDir tmp;
  const auto config = l3::model::preset("tiny");
  const ParameterLayout layout(config, HeadKind::language_model, lora_of(4, 8.0, "q,v"));
  const auto good = tmp.path() / "good";
  l3::ckpt::write_peft_adapter(good.string(), layout, random_values(layout, 51), {});
  const auto keep_all = [](const std::string&) { return true; };
  const auto no_edit = [](nlohmann::json&) {};
  const auto fails = [](const std::filesystem::path& dir, const ParameterLayout& as) {
    try {
      (void)l3::ckpt::read_peft_adapter(dir.string(), as);
    } catch (const l3::core::Error& e) {
      CHECK(e.exit_code() == 2);
      return std::string(e.what());
    }
    return std::string("(no error)");
  };

  const std::string q1 = "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight";
  const auto missing = tmp.path() / "missing";
  rewrite(good, missing, no_edit, [&](const std::string& name) { return name != q1; });
  const std::string missing_error = fails(missing, layout);
  CHECK_THAT(missing_error, Catch::Contains((missing / "adapter_model.safetensors").string()) &&
                                Catch::Contains(q1) && Catch::Contains("missing"));

  // Another rank: the config says 8, the tensors are of rank 4.
  const auto rank = tmp.path() / "rank";
  rewrite(
      good, rank, [](nlohmann::json& c) { c["r"] = 8; }, keep_all);
  const auto rank_config = l3::ckpt::read_peft_adapter_config(rank.string());
  const std::string rank_error =
      fails(rank, ParameterLayout(config, HeadKind::language_model, rank_config.lora));
  CHECK_THAT(rank_error, Catch::Contains("lora_A.weight") && Catch::Contains("has shape [4, 64]") &&
                             Catch::Contains("expected [8, 64]"));

  // A foreign target: a k_proj adapter the config does not list.
  const auto foreign = tmp.path() / "foreign";
  const std::vector<float> k_a(static_cast<std::size_t>(4 * config.hidden_size), 0.5F);
  rewrite(good, foreign, no_edit, keep_all,
          {{.name = "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight",
            .shape = {4, config.hidden_size},
            .values = k_a}});
  CHECK_THAT(fails(foreign, layout), Catch::Contains("self_attn.k_proj.lora_A.weight") &&
                                         Catch::Contains("not a tensor of this adapter"));

  // Configs this model cannot compute as PEFT would.
  const auto config_error = [&](const char* name,
                                const std::function<void(nlohmann::json&)>& edit) {
    const auto dir = tmp.path() / name;
    rewrite(good, dir, edit, keep_all);
    try {
      (void)l3::ckpt::read_peft_adapter_config(dir.string());
    } catch (const l3::core::Error& e) {
      CHECK(e.exit_code() == 2);
      CHECK_THAT(std::string(e.what()), Catch::Contains((dir / "adapter_config.json").string()));
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK_THAT(config_error("lm_head",
                          [](nlohmann::json& c) {
                            c["target_modules"] = {"q_proj", "lm_head"};
                          }),
             Catch::Contains("'lm_head'"));
  CHECK_THAT(config_error("dora", [](nlohmann::json& c) { c["use_dora"] = true; }),
             Catch::Contains("DoRA"));
  CHECK_THAT(config_error("regex", [](nlohmann::json& c) { c["target_modules"] = ".*proj"; }),
             Catch::Contains("regular expression"));
  CHECK_THAT(config_error("pattern",
                          [](nlohmann::json& c) {
                            c["rank_pattern"] = {{"q_proj", 2}};
                          }),
             Catch::Contains("rank_pattern"));
  CHECK_THAT(config_error("task", [](nlohmann::json& c) { c["task_type"] = "TOKEN_CLS"; }),
             Catch::Contains("TOKEN_CLS"));
  CHECK_THAT(config_error("no-rank", [](nlohmann::json& c) { c.erase("r"); }),
             Catch::Contains("r must be"));
  CHECK_THAT(config_error("ia3", [](nlohmann::json& c) { c["peft_type"] = "IA3"; }),
             Catch::Contains("only LoRA"));
  // A file gets the domains of the options: --lora-alpha (0, 1e6], --lora-dropout [0, 1).
  CHECK_THAT(config_error("alpha-huge", [](nlohmann::json& c) { c["lora_alpha"] = 1e39; }),
             Catch::Contains("lora_alpha 1e+39 is outside (0, 1e+06]"));
  CHECK_THAT(config_error("alpha-zero", [](nlohmann::json& c) { c["lora_alpha"] = 0; }),
             Catch::Contains("lora_alpha 0 is outside"));
  CHECK_THAT(config_error("alpha-negative", [](nlohmann::json& c) { c["lora_alpha"] = -8; }),
             Catch::Contains("lora_alpha -8 is outside"));
  CHECK_THAT(config_error("dropout-one", [](nlohmann::json& c) { c["lora_dropout"] = 1; }),
             Catch::Contains("lora_dropout 1 is outside [0, 1)"));
  // Weights that are not finite.
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const auto dir = tmp.path() / (std::isnan(bad) ? "nan" : "inf");
    std::vector<float> poisoned(static_cast<std::size_t>(4 * config.hidden_size), 0.25F);
    poisoned[5] = bad;
    rewrite(good, dir, no_edit, [&](const std::string& name) { return name != q1; },
            {{.name = q1, .shape = {config.hidden_size, 4}, .values = poisoned}});
    CHECK_THAT(fails(dir, layout), Catch::Contains(q1) && Catch::Contains("element 5 is") &&
                                       Catch::Contains("must be finite"));
  }
  // PEFT's own spellings that mean what this model computes are read as such.
  rewrite(
      good, tmp.path() / "all-linear",
      [](nlohmann::json& c) { c["target_modules"] = "all-linear"; }, keep_all);
  CHECK(l3::ckpt::read_peft_adapter_config((tmp.path() / "all-linear").string()).lora.targets ==
        0x7F);
  rewrite(
      good, tmp.path() / "paths",
      [](nlohmann::json& c) {
        c["target_modules"] = {"self_attn.q_proj", "v_proj"};
      },
      keep_all);
  CHECK(l3::ckpt::read_peft_adapter_config((tmp.path() / "paths").string()).lora.targets ==
        layout.lora().targets);
}

TEST_CASE("an existing adapter directory is replaced only when asked and only when it is one",
          "[ckpt][lora]") {
  const l3::test::TempDir tmp;
  const auto config = l3::model::preset("tiny");
  const ParameterLayout layout(config, HeadKind::language_model, lora_of(2, 4.0, "o"));
  const auto values = random_values(layout, 52);
  const auto dir = tmp.path() / "adapter";
  l3::ckpt::write_peft_adapter(dir.string(), layout, values, {});
  CHECK_THROWS_WITH(l3::ckpt::write_peft_adapter(dir.string(), layout, values, {}),
                    Catch::Contains("--overwrite"));
  l3::ckpt::write_peft_adapter(dir.string(), layout, values, {.overwrite = true});
  CHECK(l3::ckpt::read_peft_adapter(dir.string(), layout) == values);
  const auto other = tmp.path() / "notes";
  std::filesystem::create_directories(other);
  tmp.write("notes/todo.txt", "keep me");
  CHECK_THROWS_WITH(
      l3::ckpt::write_peft_adapter(other.string(), layout, values, {.overwrite = true}),
      Catch::Contains("not a LoRA adapter directory"));
  CHECK(std::filesystem::exists(other / "todo.txt"));
  // A directory PEFT wrote holds the same two files (and its model card), without our key in
  // the safetensors metadata: it is not ours, with or without the card.
  const auto keep_all = [](const std::string&) { return true; };
  const auto edit_none = [](nlohmann::json&) {};
  for (const bool card : {false, true}) {
    const auto peft = tmp.path() / (card ? "peft-with-card" : "peft");
    rewrite(dir, peft, edit_none, keep_all);
    if (card) tmp.write((peft / "README.md").lexically_relative(tmp.path()).string(), "# card");
    CHECK_THROWS_WITH(
        l3::ckpt::write_peft_adapter(peft.string(), layout, values, {.overwrite = true}),
        Catch::Contains("not a LoRA adapter directory") &&
            Catch::Contains(card ? "README.md" : "was not written by llama3-hpc export"));
    CHECK(l3::ckpt::read_peft_adapter(peft.string(), layout) == values);  // untouched
  }
}
