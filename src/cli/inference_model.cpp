#include "cli/inference_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <optional>
#include <vector>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/model_file.hpp"
#include "ckpt/peft_adapter.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "train/model_assembly.hpp"
#include "train/model_source.hpp"

namespace l3::cli {

namespace fs = std::filesystem;

namespace {

std::string_view head_description(model::HeadKind head) {
  return head == model::HeadKind::reward ? "a reward model (score head)"
                                         : "a language model (lm_head)";
}

}  // namespace

void declare_inference_model_options(po::options_description& options) {
  options.add_options()(
      "init", po::value<std::string>()->value_name("CKPT"),
      "the model: a checkpoint step directory, a checkpoint root holding 'latest', or a "
      "Hugging Face model directory")("ckpt", po::value<std::string>()->value_name("CKPT"),
                                      "the same as --init")(
      "tokenizer", po::value<std::string>()->value_name("FILE|bytes"),
      "tokenizer.model, tokenizer.json, a model directory or 'bytes' (default: the one the "
      "checkpoint's data was prepared with)")(
      "ignore-tokenizer-mismatch", po::bool_switch(),
      "use the tokenizer even if its sha256 differs from the checkpoint's");
  declare_adapter_option(options);
}

void declare_adapter_option(po::options_description& options) {
  options.add_options()("adapter", po::value<std::string>()->value_name("DIR"),
                        "a LoRA adapter in PEFT's format (adapter_config.json, "
                        "adapter_model.safetensors; from PEFT or llama3-hpc) to fold into the "
                        "--init model first");
}

std::string adapter_option(const po::variables_map& options) {
  return options.count("adapter") > 0 ? options["adapter"].as<std::string>() : std::string();
}

std::string model_path_option(const po::variables_map& options) {
  const bool init = options.count("init") > 0;
  const bool ckpt = options.count("ckpt") > 0;
  if (init && ckpt) throw core::usage_error("give --init or --ckpt (the same option), not both");
  if (!init && !ckpt) {
    throw core::usage_error(
        "--init CKPT is required (a checkpoint step directory or a checkpoint root)");
  }
  return options[init ? "init" : "ckpt"].as<std::string>();
}

InferenceModel describe_inference_model(const std::string& path, model::HeadKind head,
                                        const std::string& adapter) {
  const bool adapted = !adapter.empty();
  InferenceModel loaded;
  loaded.source = train::resolve_model_source("", path);
  const train::ModelSource& source = loaded.source;
  loaded.step_dir = source.origin();
  if (source.checkpoint) {
    loaded.manifest = *source.checkpoint;
  } else {  // a Hugging Face directory: its tokenizer, when it holds one
    loaded.manifest.model = source.config;
    loaded.manifest.head = source.hf_head;
    const fs::path dir(source.hf_dir);
    if (fs::exists(dir / "tokenizer.json") || fs::exists(dir / "original" / "tokenizer.model") ||
        fs::exists(dir / "tokenizer.model")) {
      loaded.manifest.tokenizer = source.hf_dir;
    }
  }
  ckpt::Manifest& m = loaded.manifest;
  // A reward adapter (PEFT's SEQ_CLS) brings its score head: its base may be a language model,
  // whose backbone it then adapts.
  const bool head_from_adapter = adapted && head == model::HeadKind::reward;
  if (m.head != head && !head_from_adapter) {
    throw core::bad_input(fmt::format("the checkpoint holds {}; this command needs {}",
                                      head_description(m.head), head_description(head)),
                          {.file = loaded.step_dir});
  }
  m.model.validate();
  loaded.adapter = adapter;
  return loaded;
}

void load_inference_weights(InferenceModel& loaded, model::HeadKind head,
                            train::ModelPurpose purpose, const dist::World* shard_over,
                            std::unique_ptr<kernels::Ops> ops) {
  loaded.ops = ops ? std::move(ops) : std::make_unique<kernels::CpuOps>();
  // Forward passes only: no gradient buffer (4 bytes per parameter of host memory). Sharded over
  // the ranks of `shard_over`, or whole on this process alone.
  train::AssembledModel assembled = train::assemble_model(
      shard_over, *loaded.ops, loaded.source,
      {.purpose = purpose,
       .head = head,
       .placement = model::Placement::frozen(shard_over != nullptr,
                                             shard_over != nullptr ? shard_over->size() : 1),
       .adapter = loaded.adapter});
  loaded.shards = std::move(assembled.frozen);
  loaded.model = std::move(assembled.model);
  if (!loaded.adapter.empty()) loaded.manifest.head = head;
}

InferenceModel load_inference_model(const std::string& path, model::HeadKind head,
                                    train::ModelPurpose purpose, const dist::World* shard_over,
                                    const std::string& adapter) {
  InferenceModel loaded = describe_inference_model(path, head, adapter);
  load_inference_weights(loaded, head, purpose, shard_over);
  return loaded;
}

tokenizer::Tokenizer load_inference_tokenizer(const std::optional<std::string>& spec,
                                              const InferenceModel& loaded, bool ignore_mismatch,
                                              const core::Logger& log) {
  const ckpt::Manifest& m = loaded.manifest;
  std::optional<tokenizer::Tokenizer> tokenizer;
  if (spec) {
    tokenizer.emplace(tokenizer::Tokenizer::load(*spec));
  } else if (m.tokenizer.empty()) {
    throw core::usage_error(
        fmt::format("--tokenizer is required: the checkpoint {} does not record its tokenizer",
                    loaded.step_dir));
  } else {
    try {
      tokenizer.emplace(tokenizer::Tokenizer::load(m.tokenizer));
    } catch (const core::Error& e) {
      throw core::bad_input(
          fmt::format("cannot load the checkpoint's tokenizer '{}' ({}); give --tokenizer",
                      m.tokenizer, e.what()),
          {.file = loaded.step_dir});
    }
  }
  if (!m.tokenizer_sha256.empty() && tokenizer->sha256() != m.tokenizer_sha256) {
    const std::string message = fmt::format(
        "tokenizer {} (sha256 {}) is not the one the checkpoint was trained with (sha256 {})",
        tokenizer->name(), tokenizer->sha256(), m.tokenizer_sha256);
    if (!ignore_mismatch) {
      throw core::bad_input(
          fmt::format("{}; --ignore-tokenizer-mismatch to use it anyway", message),
          {.file = loaded.step_dir});
    }
    log.warn("{}", message);
  }
  if (tokenizer->vocab_size() > m.model.vocab_size) {
    throw core::bad_input(
        fmt::format("tokenizer {} has {} tokens, more than the model's "
                    "vocabulary of {}",
                    tokenizer->name(), tokenizer->vocab_size(), m.model.vocab_size),
        {.file = loaded.step_dir});
  }
  return std::move(*tokenizer);
}

tokenizer::Tokenizer load_inference_tokenizer(const po::variables_map& options,
                                              const InferenceModel& loaded,
                                              const core::Logger& log) {
  std::optional<std::string> spec;
  if (options.count("tokenizer") > 0) spec = options["tokenizer"].as<std::string>();
  return load_inference_tokenizer(spec, loaded, options["ignore-tokenizer-mismatch"].as<bool>(),
                                  log);
}

}  // namespace l3::cli
