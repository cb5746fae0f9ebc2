#include "cli/export_command.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <vector>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/hf_export.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/peft_adapter.hpp"
#include "core/error.hpp"
#include "core/path_safety.hpp"
#include "train/lora_checkpoint_model.hpp"
#include "train/model_source.hpp"

namespace l3::cli {

namespace fs = std::filesystem;

void declare_export_options(po::options_description& options,
                            po::positional_options_description& /*positional*/) {
  options.add_options()("ckpt", po::value<std::string>()->value_name("CKPT"),
                        "the checkpoint: a step directory or a checkpoint root (its latest)")(
      "init", po::value<std::string>()->value_name("CKPT"), "the same as --ckpt")(
      "output", po::value<std::string>()->value_name("DIR"),
      "the Hugging Face model directory to write (new; an existing one only with --overwrite, "
      "and only when export wrote it)")(
      "merge", po::bool_switch(),
      "a LoRA checkpoint: write its base model with the adapters folded into the weights (a "
      "full Hugging Face model)")(
      "adapter", po::bool_switch(),
      "a LoRA checkpoint: write its adapters as a PEFT adapter directory (adapter_config.json, "
      "adapter_model.safetensors) for PeftModel.from_pretrained on its base")(
      "dtype", po::value<std::string>()->value_name("bf16|fp32"),
      "the safetensors dtype: bf16 (rounded to nearest even) or fp32 (bit for bit); default "
      "bf16, fp32 for --adapter (as PEFT saves)")(
      "shard-size", po::value<std::string>()->default_value("5GB")->value_name("SIZE"),
      "largest safetensors file, e.g. 5GB, 500MB (more: model-0000i-of-0000N + index)")(
      "base-model", po::value<std::string>()->value_name("NAME|DIR"),
      "--adapter: the adapter_config.json's base_model_name_or_path, what PEFT loads the adapter "
      "on (a hub name or a Hugging Face directory; default: the run's base when it is one)")(
      "format", po::value<std::string>()->default_value("hf")->value_name("hf"),
      "output format (hf, the only one)")("overwrite", po::bool_switch(),
                                          "replace an existing output directory");
}

namespace {

void print_model_report(const std::string& checkpoint, const ckpt::HfExportReport& r,
                        const std::string& dtype, const std::string& what) {
  std::cout << fmt::format("exported {}{} as {} to {}: {} files, {:.1f} MB of {} tensors{}\n",
                           checkpoint, what, r.architecture, r.directory, r.files.size(),
                           static_cast<double>(r.tensor_bytes) / 1e6, dtype,
                           r.tokenizer.empty()
                               ? " (no tokenizer files: the tokenizer the data was prepared "
                                 "with is unknown, gone or changed)"
                               : "; tokenizer: " + r.tokenizer)
            << std::flush;
}

// The models a checkpoint still reads (a LoRA checkpoint's frozen base, a DPO checkpoint's
// reference) must never be the output: replaced, they would make the checkpoint unusable.
void refuse_models_the_checkpoint_needs(const ckpt::Manifest& manifest, const std::string& step_dir,
                                        const std::string& output) {
  std::vector<std::pair<std::string, std::string>> needed;  // (path, what it is)
  if (manifest.lora && !manifest.base.empty()) needed.emplace_back(manifest.base, "its LoRA base");
  if (const auto model = manifest.reference.find("model");
      model != manifest.reference.end() && model->is_string() && !model->get<std::string>().empty())
    needed.emplace_back(model->get<std::string>(), "its DPO reference model");
  // Compared with links resolved, without a trailing separator.
  const auto resolved = [](const fs::path& p, std::error_code& ec) {
    fs::path r = fs::weakly_canonical(fs::absolute(p, ec).lexically_normal(), ec);
    while (!r.has_filename() && r != r.root_path()) r = r.parent_path();
    return r;
  };
  std::error_code ec;
  const fs::path out = resolved(core::output_directory("--output", output), ec);
  for (const auto& [path, what] : needed) {
    std::error_code ec2;
    const fs::path model = resolved(path, ec2);
    if (ec || ec2) continue;
    // The same directory, or one that holds it (a checkpoint root above a step directory).
    const auto [model_end, out_end] =
        std::mismatch(model.begin(), model.end(), out.begin(), out.end());
    if (out_end == out.end()) {
      throw core::usage_error(fmt::format(
          "--output {} is {} of {} (recorded in its manifest as {}): replacing it would leave "
          "the checkpoint unusable; choose another --output",
          output, what, step_dir, path));
    }
  }
}

}  // namespace

// Needs no base: the adapters alone.
std::string export_lora_adapter(const std::string& step_dir, const std::string& output, bool bf16,
                                bool overwrite, const std::string& base_model) {
  const ckpt::Manifest manifest = ckpt::read_manifest(step_dir);
  if (!manifest.lora) throw core::internal_error("export_lora_adapter: not a LoRA checkpoint");
  const std::vector<float> values = train::read_checkpoint_adapters(manifest, step_dir);
  const model::ParameterLayout layout = manifest.layout();
  // PEFT loads base_model_name_or_path with transformers: a hub name or a Hugging Face
  // directory, never a llama3-hpc checkpoint.
  const bool base_is_hf = !ckpt::is_checkpoint(manifest.base) &&
                          fs::is_regular_file(fs::path(manifest.base) / "config.json");
  const std::string recorded = !base_model.empty() ? base_model : base_is_hf ? manifest.base : "";
  ckpt::write_peft_adapter(output, layout, values,
                           {.bf16 = bf16, .overwrite = overwrite, .base_model = recorded});
  std::string line = fmt::format(
      "exported {} as a PEFT LoRA adapter ({}, r={}, alpha={}, targets {}) to {}: {:.2f} MB of "
      "{} tensors for the base model {}",
      step_dir, ckpt::adapter_kind(manifest.head), manifest.lora->rank, manifest.lora->alpha,
      manifest.lora->targets_text(), output,
      static_cast<double>(layout.parameter_count()) * (bf16 ? 2 : 4) / 1e6, bf16 ? "bf16" : "fp32",
      manifest.base);
  if (recorded.empty()) {
    line += fmt::format(
        "; its base_model_name_or_path is left empty: the base is a llama3-hpc checkpoint, which "
        "PEFT cannot load (llama3-hpc export --ckpt {} --output BASE_DIR makes one it can; then "
        "export the adapter with --base-model BASE_DIR)",
        manifest.base);
  }
  return line;
}

int run_export(const CommandContext& context) {
  const po::variables_map& o = context.options;
  if (o.count("ckpt") != 0 && o.count("init") != 0)
    throw core::usage_error("give --ckpt or --init (the same option), not both");
  if (o.count("ckpt") == 0 && o.count("init") == 0)
    throw core::usage_error("--ckpt CKPT is required (the checkpoint to export)");
  if (o.count("output") == 0) throw core::usage_error("--output DIR is required");
  const bool merge = o["merge"].as<bool>();
  const bool adapter = o["adapter"].as<bool>();
  if (o.count("base-model") != 0 && !adapter)
    throw core::usage_error("--base-model goes with --adapter (the adapter's base model)");
  if (merge && adapter)
    throw core::usage_error("give --merge (a full model) or --adapter (a PEFT adapter), not both");
  const std::string dtype =
      o.count("dtype") != 0 ? o["dtype"].as<std::string>() : (adapter ? "fp32" : "bf16");
  if (dtype != "bf16" && dtype != "fp32")
    throw core::usage_error(fmt::format("--dtype {}: use bf16 or fp32", dtype));
  if (o["format"].as<std::string>() != "hf")
    throw core::usage_error(
        fmt::format("--format {}: hf is the only format", o["format"].as<std::string>()));
  ckpt::HfExportOptions options;
  options.bf16 = dtype == "bf16";
  options.shard_bytes = ckpt::parse_byte_size(o["shard-size"].as<std::string>());
  options.overwrite = o["overwrite"].as<bool>();
  if (!context.world.is_root()) return core::kExitOk;
  const std::string checkpoint = o[o.count("ckpt") != 0 ? "ckpt" : "init"].as<std::string>();
  const std::string output = o["output"].as<std::string>();
  const std::string step_dir = ckpt::resolve_checkpoint(checkpoint);
  const ckpt::Manifest manifest = ckpt::read_manifest(step_dir);
  if (manifest.lora && !merge && !adapter) {
    throw core::bad_input(
        fmt::format("a LoRA checkpoint ({} adapters of rank {} for the model {}): give --merge "
                    "to write that model with the adapters folded in, or --adapter to write a "
                    "PEFT adapter directory",
                    manifest.lora->targets_text(), manifest.lora->rank, manifest.base),
        {.file = step_dir});
  }
  if (!manifest.lora && (merge || adapter)) {
    throw core::bad_input(fmt::format("--{}: not a LoRA checkpoint (it holds a whole model, "
                                      "which export writes without --{})",
                                      merge ? "merge" : "adapter", merge ? "merge" : "adapter"),
                          {.file = step_dir});
  }
  refuse_models_the_checkpoint_needs(manifest, step_dir, output);
  if (adapter) {
    std::cout << export_lora_adapter(
                     step_dir, output, options.bf16, options.overwrite,
                     o.count("base-model") != 0 ? o["base-model"].as<std::string>() : std::string())
              << "\n"
              << std::flush;
    return core::kExitOk;
  }
  if (merge) {
    train::LoraCheckpointModel merged(train::resolve_model_source("", step_dir));
    const ckpt::HfExportReport r = ckpt::export_hugging_face(
        manifest, step_dir,
        [&](const model::TensorInfo& t, std::span<float> values) { merged.read(t, values); },
        output, options);
    print_model_report(step_dir, r, dtype, fmt::format(" merged into {}", manifest.base));
    return core::kExitOk;
  }
  print_model_report(checkpoint, ckpt::export_hugging_face(step_dir, output, options), dtype, "");
  return core::kExitOk;
}

}  // namespace l3::cli
