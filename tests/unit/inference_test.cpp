// generate and score below the command line: a checkpoint written to disk, loaded back for
// inference, prompts formatted as training data, records scored.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "catch.hpp"
#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/model_file.hpp"
#include "ckpt/peft_adapter.hpp"
#include "cli/inference_model.hpp"
#include "cli/prompt_format.hpp"
#include "cli/record_scoring.hpp"
#include "core/error.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/generator.hpp"
#include "model/lora_config.hpp"
#include "temp_dir.hpp"
#include "train/objectives/bradley_terry_loss.hpp"
#include "train/objectives/language_model_loss.hpp"
#include "train/reward_scores.hpp"

using l3::cli::InferenceModel;
using l3::model::HeadKind;
using l3::model::LlamaModel;
using l3::tokenizer::Special;
using l3::tokenizer::Tokenizer;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const Tokenizer& bytes() {
  static const Tokenizer t = Tokenizer::bytes();
  return t;
}

// A checkpoint root holding step 5 and `latest`, as commit_checkpoint leaves it, of a tiny
// model with random weights; returns the weights.
std::vector<float> write_checkpoint(const fs::path& root, HeadKind head, std::uint64_t seed,
                                    const std::string& tokenizer_sha256) {
  l3::ckpt::Manifest manifest;
  manifest.step = 5;
  manifest.phase = head == HeadKind::reward ? l3::Phase::reward : l3::Phase::sft;
  manifest.head = head;
  manifest.model = l3::model::preset("tiny");
  manifest.tokenizer = "bytes";
  manifest.tokenizer_sha256 = tokenizer_sha256;
  l3::kernels::CpuOps ops;
  LlamaModel model(manifest.model, head, ops);
  model.initialize(seed);
  std::vector<float> weights = model.master_to_host();
  const fs::path step = root / l3::ckpt::step_dir_name(manifest.step);
  fs::create_directories(step);
  l3::ckpt::write_model_file((step / l3::ckpt::kModelFile).string(), model.layout(), weights);
  std::ofstream(step / l3::ckpt::kManifestFile) << manifest.to_json().dump(2) << '\n';
  std::ofstream(root / l3::ckpt::kLatestFile) << step.filename().string() << '\n';
  return weights;
}

l3::core::Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const l3::core::Error& e) {
    return e;
  }
  FAIL("no error");
  return l3::core::internal_error("unreachable");
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a checkpoint loads for generation with its tokenizer", "[generate][ckpt]") {
  const l3::test::TempDir dir;
  const fs::path root = dir.path() / "run";
  const std::vector<float> weights =
      write_checkpoint(root, HeadKind::language_model, 17, bytes().sha256());

  // the root (through `latest`) and the step directory both work
  const InferenceModel loaded = l3::cli::load_inference_model(
      root.string(), HeadKind::language_model, l3::train::ModelPurpose::generate);
  CHECK(loaded.step_dir == (root / "step-00000005").string());
  CHECK(loaded.manifest.step == 5);
  CHECK(loaded.model->master_to_host() == weights);
  const InferenceModel again = l3::cli::load_inference_model(
      loaded.step_dir, HeadKind::language_model, l3::train::ModelPurpose::generate);
  CHECK(again.model->master_to_host() == weights);

  const l3::core::Logger log;
  const Tokenizer tokenizer = l3::cli::load_inference_tokenizer(std::nullopt, loaded, false, log);
  CHECK(tokenizer.name() == "bytes");

  // Generation from the loaded model is that of the model it was written from.
  l3::kernels::CpuOps ops;
  LlamaModel original(l3::model::preset("tiny"), HeadKind::language_model, ops);
  original.initialize(17);
  const auto prompt = l3::cli::generation_prompt(tokenizer, "Hello", true, std::nullopt);
  l3::model::GenerationOptions options;
  options.max_new = 8;
  options.stop_tokens = {tokenizer.special(Special::end_of_turn)};
  l3::model::Generator from_disk(*loaded.model);
  l3::model::Generator from_memory(original);
  CHECK(from_disk.generate(prompt, options).tokens == from_memory.generate(prompt, options).tokens);
}

TEST_CASE("checkpoint loading refuses what it cannot use", "[generate][ckpt]") {
  const l3::test::TempDir dir;
  const fs::path lm = dir.path() / "lm";
  const fs::path rm = dir.path() / "rm";
  write_checkpoint(lm, HeadKind::language_model, 1, bytes().sha256());
  write_checkpoint(rm, HeadKind::reward, 2, std::string(64, '0'));

  auto e = error_of([&] {
    (void)l3::cli::load_inference_model(rm.string(), HeadKind::language_model,
                                        l3::train::ModelPurpose::generate);
  });
  CHECK(e.kind() == l3::core::ErrorKind::bad_input);
  CHECK(contains(e.what(), "reward model"));
  e = error_of([&] {
    (void)l3::cli::load_inference_model(lm.string(), HeadKind::reward,
                                        l3::train::ModelPurpose::generate);
  });
  CHECK(e.kind() == l3::core::ErrorKind::bad_input);

  const fs::path plain = dir.path() / "plain";
  fs::create_directories(plain);
  e = error_of([&] {
    (void)l3::cli::load_inference_model(plain.string(), HeadKind::reward,
                                        l3::train::ModelPurpose::generate);
  });
  CHECK(e.kind() == l3::core::ErrorKind::bad_input);
  CHECK(contains(e.what(), plain.string()));
  CHECK(contains(e.what(), "not a checkpoint"));
  e = error_of([&] {
    (void)l3::cli::load_inference_model((dir.path() / "missing").string(), HeadKind::reward,
                                        l3::train::ModelPurpose::generate);
  });
  CHECK(contains(e.what(), "missing"));

  const fs::path hf = dir.path() / "hf";
  fs::create_directories(hf);
  std::ofstream(hf / "config.json") << "{}";
  std::ofstream(hf / "model.safetensors") << "";
  e = error_of([&] {
    (void)l3::cli::load_inference_model(hf.string(), HeadKind::language_model,
                                        l3::train::ModelPurpose::generate);
  });
  CHECK(e.kind() == l3::core::ErrorKind::bad_input);  // no architectures: not a Llama model
  CHECK(contains(e.what(), "only LlamaForCausalLM and LlamaForSequenceClassification"));

  // The reward checkpoint records another tokenizer's sha256.
  const InferenceModel loaded = l3::cli::load_inference_model(rm.string(), HeadKind::reward,
                                                              l3::train::ModelPurpose::generate);
  const l3::core::Logger quiet(0, 1, l3::core::LogConfig{.level = l3::core::LogLevel::off});
  e = error_of(
      [&] { (void)l3::cli::load_inference_tokenizer(std::nullopt, loaded, false, quiet); });
  CHECK(e.kind() == l3::core::ErrorKind::bad_input);
  CHECK(contains(e.what(), "--ignore-tokenizer-mismatch"));
  CHECK(l3::cli::load_inference_tokenizer("bytes", loaded, true, quiet).name() == "bytes");
}

TEST_CASE("generation prompts follow the training template", "[generate]") {
  const Tokenizer& t = bytes();
  auto ids = [&](std::initializer_list<std::variant<Special, std::string>> parts) {
    std::vector<std::int32_t> out;
    for (const auto& part : parts) {
      if (const auto* s = std::get_if<Special>(&part)) {
        out.push_back(t.special(*s));
      } else {
        t.encode_append(std::get<std::string>(part), out);
      }
    }
    return out;
  };
  CHECK(l3::cli::generation_prompt(t, "Hi there", false, std::nullopt) ==
        ids({Special::begin_of_text, std::string("Hi there")}));
  CHECK(
      l3::cli::generation_prompt(t, " Hi ", true, std::nullopt) ==
      ids({Special::begin_of_text, Special::start_header, std::string("user"), Special::end_header,
           std::string("\n\nHi"), Special::end_of_turn, Special::start_header,
           std::string("assistant"), Special::end_header, std::string("\n\n")}));
  CHECK(l3::cli::generation_prompt(t, "Hi", true, std::string("Be brief.")) ==
        ids({Special::begin_of_text, Special::start_header, std::string("system"),
             Special::end_header, std::string("\n\nBe brief."), Special::end_of_turn,
             Special::start_header, std::string("user"), Special::end_header, std::string("\n\nHi"),
             Special::end_of_turn, Special::start_header, std::string("assistant"),
             Special::end_header, std::string("\n\n")}));
}

TEST_CASE("records are scored as the reward model was trained", "[score][ckpt]") {
  const l3::test::TempDir dir;
  write_checkpoint(dir.path(), HeadKind::reward, 3, bytes().sha256());
  const InferenceModel loaded = l3::cli::load_inference_model(dir.path().string(), HeadKind::reward,
                                                              l3::train::ModelPurpose::generate);
  const l3::prep::RecordFormatter formatter(bytes(), l3::prep::FormatOptions{});
  const std::int32_t pad = bytes().special(Special::finetune_right_pad);
  LlamaModel& model = *loaded.model;

  const json pair = json::parse(R"({"prompt": "Q?", "chosen": "Yes.", "rejected": "No!"})");
  const auto example = formatter.preference(pair);
  const float chosen = l3::train::sequence_reward(model, example.chosen.tokens, pad);
  const float rejected = l3::train::sequence_reward(model, example.rejected.tokens, pad);
  const l3::cli::RecordScore scored = l3::cli::score_record(model, formatter, pair, pad);
  CHECK(scored.pair);
  CHECK(scored.chosen == Approx(chosen).epsilon(1e-5));
  CHECK(scored.rejected == Approx(rejected).epsilon(1e-5));
  CHECK(scored.correct() == (scored.chosen > scored.rejected));

  // A response alone is the chosen side of a pair with that response.
  const json single = json::parse(R"({"prompt": "Q?", "response": "Yes."})");
  CHECK(formatter.response(single).tokens == example.chosen.tokens);
  const l3::cli::RecordScore alone = l3::cli::score_record(model, formatter, single, pad);
  CHECK_FALSE(alone.pair);
  CHECK(alone.chosen == Approx(chosen).epsilon(1e-5));
  CHECK(alone.to_json(4).dump() ==
        nlohmann::ordered_json{{"line", 4}, {"reward", l3::cli::json_number(alone.chosen)}}.dump());
  CHECK(scored.to_json(1).dump().starts_with(R"({"line":1,"chosen":)"));

  l3::cli::ScoreSummary summary;
  summary.add(scored);
  summary.add(l3::cli::RecordScore{.pair = true, .chosen = 1.0F, .rejected = 1.0F});  // a tie
  summary.add(alone);
  const nlohmann::ordered_json s = summary.to_json();
  CHECK(s["pairs"] == 2);
  CHECK(s["accuracy"].get<double>() == Approx(scored.correct() ? 0.5 : 0.0));
  CHECK(s["mean_margin"].get<double>() == Approx((scored.chosen - scored.rejected) / 2.0));
  CHECK(s["responses"] == 1);
  CHECK(l3::cli::ScoreSummary{}.to_json()["accuracy"].is_null());
  CHECK(l3::cli::json_number(0.1F) == 0.1);

  auto e = error_of([&] {
    (void)l3::cli::score_record(model, formatter, json::parse(R"({"prompt": "Q"})"), pad);
  });
  CHECK(e.kind() == l3::core::ErrorKind::bad_input);
  e = error_of([&] {
    (void)l3::cli::score_record(model, formatter, json::parse(R"({"response": "A"})"), pad);
  });
  CHECK(contains(e.what(), "\"response\" is a string but there is no \"prompt\""));
}

TEST_CASE("a PEFT adapter folds into the loaded model: the adapter model's scores and logits",
          "[generate][score][lora]") {
  const l3::test::TempDir dir;
  const l3::model::ModelConfig config = l3::model::preset("tiny");
  l3::model::LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 8.0;
  lora.targets = l3::model::parse_lora_targets("q,v,o,down");
  // The base is an SFT (language model) checkpoint for both: a SEQ_CLS adapter brings the
  // reward model's score head.
  const std::vector<float> base =
      write_checkpoint(dir.path() / "sft", HeadKind::language_model, 8, bytes().sha256());
  l3::model::BatchBuilder builder(2, 24, 0);
  REQUIRE(builder.add_pair({5, 9, 11, 40, 7}, {5, 9, 12, 41}, 0.0F));
  const l3::model::Batch pairs = builder.finish();
  l3::model::BatchBuilder sft(1, 16, 0);
  REQUIRE(sft.add({3, 4, 5, 6, 7, 8}, {0, 0, 1, 1, 1, 1}) >= 0);
  const l3::model::Batch text = sft.finish();
  for (const HeadKind head : {HeadKind::language_model, HeadKind::reward}) {
    INFO("reward " << (head == HeadKind::reward));
    // The adapter model: the base's weights (a reward model takes its backbone) and adapters
    // with B away from zero.
    l3::kernels::CpuOps ops;
    l3::model::ModelOptions options;
    options.lora = lora;
    LlamaModel adapted(config, head, ops, options);
    adapted.initialize(3);
    const l3::model::ParameterLayout base_layout(config, HeadKind::language_model);
    std::vector<float> weights(static_cast<std::size_t>(adapted.layout().total()), 0.0F);
    for (const auto& t : adapted.layout().tensors()) {
      if (t.name == "score.weight") continue;
      const auto& from = base_layout.find(t.name);
      std::copy_n(base.begin() + from.offset, t.numel, weights.begin() + t.offset);
    }
    adapted.load_parameters(weights);
    auto values = adapted.trainable_parameters().as<float>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = 0.02F * static_cast<float>(static_cast<int>((i * 7919) % 201) - 100) / 100.0F;
    }
    const auto adapter = dir.path() / (head == HeadKind::reward ? "reward-adapter" : "adapter");
    l3::ckpt::write_peft_adapter(adapter.string(), adapted.trainable_layout(),
                                 adapted.trainable_parameters().as<float>(), {});

    const InferenceModel loaded =
        l3::cli::load_inference_model((dir.path() / "sft").string(), head,
                                      l3::train::ModelPurpose::generate, nullptr, adapter.string());
    CHECK(loaded.adapter == adapter.string());
    CHECK(loaded.manifest.head == head);
    CHECK_FALSE(loaded.model->has_adapters());  // folded in: a plain model
    if (head == HeadKind::reward) {
      const auto expected = l3::train::BradleyTerryLoss(adapted).forward(pairs, 0.0);
      const auto got = l3::train::BradleyTerryLoss(*loaded.model).forward(pairs, 0.0);
      CHECK(got.chosen[0] == Approx(expected.chosen[0]).epsilon(1e-5));
      CHECK(got.rejected[0] == Approx(expected.rejected[0]).epsilon(1e-5));
    } else {
      const auto expected = adapted.logits(text);
      const auto got = loaded.model->logits(text);
      REQUIRE(got.size() == expected.size());
      double worst = 0.0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - expected[i]) /
                                    (1e-3 + std::abs(static_cast<double>(expected[i]))));
      }
      CHECK(worst < 1e-4);
      CHECK(l3::train::LanguageModelLoss(*loaded.model).forward(text).loss ==
            Approx(l3::train::LanguageModelLoss(adapted).forward(text).loss).epsilon(1e-5));
    }
  }
  // A language-model adapter cannot make a reward model, nor the reverse.
  const l3::core::Error wrong = error_of([&] {
    (void)l3::cli::load_inference_model((dir.path() / "sft").string(), HeadKind::reward,
                                        l3::train::ModelPurpose::generate, nullptr,
                                        (dir.path() / "adapter").string());
  });
  CHECK(wrong.exit_code() == 2);
  CHECK(contains(wrong.what(), "adapter_config.json"));
  CHECK(contains(wrong.what(),
                 "holds a CAUSAL_LM adapter (language model); this model needs a "
                 "SEQ_CLS adapter (reward model)"));
  CHECK(error_of([&] {
          (void)l3::cli::load_inference_model((dir.path() / "sft").string(), HeadKind::reward,
                                              l3::train::ModelPurpose::generate, nullptr,
                                              (dir.path() / "absent").string());
        }).exit_code() == 2);
}
