#include "ckpt/hf_export.hpp"

#include <fmt/format.h>

#include <cctype>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/model_file.hpp"
#include "ckpt/tensor_file.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/path_safety.hpp"
#include "io/safetensors/safetensors_writer.hpp"
#include "io/tokenizer/hf_tokenizer_files.hpp"
#include "io/tokenizer/special_tokens.hpp"
#include "model/parameter_layout.hpp"

namespace l3::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The Llama 3 special tokens config.json and generation_config.json name: the run's own
// tokenizer's (Meta's: 128000..128255; `bytes`: 256..511), whatever the model's vocabulary is
// (tiny-llama3 trained on bytes data has Llama 3's 128,256 rows but stops at id 265, not 128009).
struct TokenIds {
  std::int64_t bos = 0;
  json eos;
  std::int64_t pad = 0;
};

TokenIds token_ids(std::int64_t first_special) {
  const auto id = [&](tokenizer::Special s) {
    return first_special + static_cast<std::int64_t>(s);
  };
  return {id(tokenizer::Special::begin_of_text),
          json::array({id(tokenizer::Special::end_of_text), id(tokenizer::Special::end_of_message),
                       id(tokenizer::Special::end_of_turn)}),
          id(tokenizer::Special::finetune_right_pad)};
}

// The tokenizer the data was prepared with, when it can still be loaded and is the one recorded
// (its sha256); nullopt when the checkpoint names none, or the file is gone or changed.
std::optional<tokenizer::Tokenizer> recorded_tokenizer(const Manifest& manifest) {
  if (manifest.tokenizer.empty()) return std::nullopt;
  std::optional<tokenizer::Tokenizer> t;
  try {
    t = tokenizer::Tokenizer::load(manifest.tokenizer);
  } catch (const core::Error&) {
    return std::nullopt;  // moved or removed since prep: nothing to derive the ids from
  }
  if (!manifest.tokenizer_sha256.empty() && t->sha256() != manifest.tokenizer_sha256)
    return std::nullopt;
  return t;
}

// Where the special tokens start: the run's tokenizer's block; without one (data from the C API,
// a tokenizer file since removed), `bytes` when the checkpoint says so, else the last 256 ids of
// the vocabulary as in Meta's tokenizer.
std::int64_t first_special_id(const Manifest& manifest,
                              const std::optional<tokenizer::Tokenizer>& tokenizer) {
  if (tokenizer) return tokenizer->first_special();
  if (manifest.tokenizer == "bytes") return tokenizer::Tokenizer::bytes().first_special();
  return manifest.model.vocab_size - tokenizer::kSpecialTokenCount;
}

// Meta's tokenizer.model the data was prepared with, and the HF tokenizer files next to it
// (`DIR/original/tokenizer.model` and `DIR/tokenizer*.json`), copied when they exist.
bool copy_tokenizer(const std::string& recorded, const fs::path& into) {
  if (recorded.empty() || recorded == "bytes") return false;
  fs::path source(recorded);
  if (fs::is_directory(source)) {
    for (const char* candidate : {"original/tokenizer.model", "tokenizer.model"}) {
      if (fs::is_regular_file(source / candidate)) {
        source = source / candidate;
        break;
      }
    }
  }
  if (!fs::is_regular_file(source)) return false;
  bool copied = false;
  if (source.filename() == "tokenizer.model") {
    fs::create_directories(into / "original");
    fs::copy_file(source, into / "original" / "tokenizer.model");
    copied = true;
  }
  const fs::path hf_dir = source.parent_path().filename() == "original"
                              ? source.parent_path().parent_path()
                              : source.parent_path();
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    if (fs::is_regular_file(hf_dir / name)) {
      fs::copy_file(hf_dir / name, into / name);
      copied = true;
    }
  }
  return copied;
}

// Hugging Face's tokenizer files (io/tokenizer/hf_tokenizer_files.hpp) for the tokenizer the
// data was prepared with (recorded_tokenizer: Meta's tokenizer.model, checked against the sha256
// the checkpoint recorded, or the built-in bytes one). What it did, for the report; "" when the
// tokenizer is unknown or its file is gone or changed (the export then has no tokenizer files).
std::string write_hf_tokenizer(const Manifest& manifest,
                               const std::optional<tokenizer::Tokenizer>& t, const fs::path& into) {
  if (!t) return {};
  const tokenizer::HfTokenizerFiles files =
      tokenizer::hugging_face_tokenizer_files(*t, manifest.model.max_position_embeddings);
  core::write_file_atomically((into / "tokenizer.json").string(), files.tokenizer_json);
  core::write_file_atomically((into / "tokenizer_config.json").string(),
                              files.tokenizer_config_json);
  core::write_file_atomically((into / "special_tokens_map.json").string(),
                              files.special_tokens_map_json);
  return fmt::format(
      "tokenizer.json, tokenizer_config.json (with the chat template) written for {}",
      manifest.tokenizer == "bytes" ? "the bytes tokenizer" : manifest.tokenizer);
}

}  // namespace

std::uint64_t parse_byte_size(const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) != 0))
    ++digits;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::uint64_t kilo = unit.ends_with("IB") ? 1024 : 1000;
  std::uint64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KB" || unit == "KIB") scale = kilo;
  if (unit == "MB" || unit == "MIB") scale = kilo * kilo;
  if (unit == "GB" || unit == "GIB") scale = kilo * kilo * kilo;
  if (digits == 0 || scale == 0 || digits > 12) {
    throw core::usage_error(
        fmt::format("'{}' is not a size (write e.g. 5GB, 500MB, 2GiB or a number of bytes)", text));
  }
  const std::uint64_t value = std::stoull(text.substr(0, digits)) * scale;
  if (value == 0) throw core::usage_error(fmt::format("'{}': the size must not be 0", text));
  return value;
}

HfExportReport export_hugging_face(const std::string& checkpoint, const std::string& output,
                                   const HfExportOptions& options) {
  const std::string step_dir = resolve_checkpoint(checkpoint);
  const Manifest manifest = read_manifest(step_dir);
  if (manifest.lora) {
    throw core::bad_input(
        fmt::format("a LoRA checkpoint: it holds {} adapters for the model {}, not a model; "
                    "export them as a PEFT adapter, or merged into that model",
                    manifest.lora->targets_text(), manifest.base),
        {.file = step_dir});
  }
  // The weights, streamed tensor by tensor (the exporter holds one tensor, never the model),
  // each checked against the checkpoint's checksums before it is written; a damaged one stops
  // the export with nothing installed at --output. The file is opened when the output is known
  // to be writable.
  const std::string model_path = (fs::path(step_dir) / kModelFile).string();
  std::unique_ptr<TensorFileReader> model_file;
  const TensorFill fill = [&](const model::TensorInfo& t, std::span<float> values) {
    if (!model_file) {
      model_file = std::make_unique<TensorFileReader>(model_path);
      require_model_format(*model_file);
    }
    model_file->read(t.name, t.shape, 0, values);
    check_loaded_tensor(manifest, step_dir, t, values);
  };
  return export_hugging_face(manifest, step_dir, fill, output, options);
}

HfExportReport export_hugging_face(const Manifest& manifest, const std::string& step_dir,
                                   const TensorFill& fill, const std::string& output,
                                   const HfExportOptions& options) {
  // The output is checked, and the directory it is built in created, before the weights are
  // read: an output that cannot be written or must not be replaced costs no time.
  const fs::path out =
      core::replaceable_output("--output", output, core::OwnedKind::hf_export, options.overwrite);
  core::StagingDirectory staging(out, core::OwnedKind::hf_export, "--output");
  const fs::path& partial = staging.path();

  const model::ParameterLayout layout(manifest.model, manifest.head);
  std::vector<safetensors::TensorToWrite> tensors;
  for (const model::TensorInfo& t : layout.tensors()) {
    tensors.push_back({.name = t.name,
                       .shape = t.shape,
                       .values = {},
                       .fill = [&fill, t](std::span<float> values) { fill(t, values); }});
  }

  const bool reward = manifest.head == model::HeadKind::reward;
  HfExportReport report;
  report.architecture = reward ? "LlamaForSequenceClassification" : "LlamaForCausalLM";
  report.files = safetensors::write_safetensors_model(
      partial.string(), tensors,
      options.bf16 ? safetensors::SafetensorsDType::bf16 : safetensors::SafetensorsDType::f32,
      options.shard_bytes, {{"format", "pt"}});
  for (const model::TensorInfo& t : layout.tensors())
    report.tensor_bytes += static_cast<std::uint64_t>(t.numel) * (options.bf16 ? 2 : 4);

  json config = manifest.model.to_hf_json();
  config["architectures"] = json::array({report.architecture});
  config["torch_dtype"] = options.bf16 ? "bfloat16" : "float32";
  const std::optional<tokenizer::Tokenizer> run_tokenizer = recorded_tokenizer(manifest);
  const TokenIds ids = token_ids(first_special_id(manifest, run_tokenizer));
  config["bos_token_id"] = ids.bos;
  config["eos_token_id"] = ids.eos;
  config["pad_token_id"] = ids.pad;  // never an eos id: a reward model reads the last non-pad
  if (reward) {
    config["num_labels"] = 1;
    config["id2label"] = {{"0", "LABEL_0"}};
    config["label2id"] = {{"LABEL_0", 0}};
  }
  config["llama3_hpc"] = {{"checkpoint", fs::absolute(step_dir).string()},
                          {"step", manifest.step},
                          {"phase", core::phase_name(manifest.phase)},
                          {"git_commit", manifest.git_commit}};
  if (manifest.lora) {
    config["llama3_hpc"]["merged_lora"] = {{"base", manifest.base},
                                           {"r", manifest.lora->rank},
                                           {"alpha", manifest.lora->alpha},
                                           {"rslora", manifest.lora->rslora},
                                           {"targets", manifest.lora->targets_text()}};
  }
  core::write_file_atomically((partial / "config.json").string(), config.dump(2) + "\n");
  report.files.emplace_back("config.json");
  if (!reward) {
    const json generation = {
        {"bos_token_id", ids.bos}, {"eos_token_id", ids.eos}, {"pad_token_id", ids.pad}};
    core::write_file_atomically((partial / "generation_config.json").string(),
                                generation.dump(2) + "\n");
    report.files.emplace_back("generation_config.json");
  }
  report.tokenizer_copied = copy_tokenizer(manifest.tokenizer, partial);
  if (!fs::exists(partial / "tokenizer.json")) {
    report.tokenizer = write_hf_tokenizer(manifest, run_tokenizer, partial);
    if (!report.tokenizer.empty()) {
      for (const char* name :
           {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
        report.files.emplace_back(name);
    }
  } else {
    report.tokenizer = "copied from beside " + manifest.tokenizer;
  }

  core::fsync_path(partial.string());
  staging.install(options.overwrite);
  report.directory = out.string();
  return report;
}

}  // namespace l3::ckpt
