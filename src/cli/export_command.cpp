#include "cli/export_command.hpp"

#include <fmt/format.h>

#include <iostream>

#include "ckpt/hf_export.hpp"
#include "core/error.hpp"

namespace l3::cli {

void declare_export_options(po::options_description& options,
                            po::positional_options_description& /*positional*/) {
  options.add_options()("ckpt", po::value<std::string>()->value_name("CKPT"),
                        "the checkpoint: a step directory or a checkpoint root (its latest)")(
      "init", po::value<std::string>()->value_name("CKPT"), "the same as --ckpt")(
      "output", po::value<std::string>()->value_name("DIR"),
      "the Hugging Face model directory to write (must not exist)")(
      "dtype", po::value<std::string>()->default_value("bf16")->value_name("bf16|fp32"),
      "the safetensors dtype: bf16 (rounded to nearest even) or fp32 (bit for bit)")(
      "shard-size", po::value<std::string>()->default_value("5GB")->value_name("SIZE"),
      "largest safetensors file, e.g. 5GB, 500MB (more: model-0000i-of-0000N + index)")(
      "format", po::value<std::string>()->default_value("hf")->value_name("hf"),
      "output format (hf, the only one)")("overwrite", po::bool_switch(),
                                          "replace an existing output directory");
}

int run_export(const CommandContext& context) {
  const po::variables_map& o = context.options;
  if (o.count("ckpt") != 0 && o.count("init") != 0)
    throw core::usage_error("give --ckpt or --init (the same option), not both");
  if (o.count("ckpt") == 0 && o.count("init") == 0)
    throw core::usage_error("--ckpt CKPT is required (the checkpoint to export)");
  if (o.count("output") == 0) throw core::usage_error("--output DIR is required");
  const std::string dtype = o["dtype"].as<std::string>();
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
  const ckpt::HfExportReport r =
      ckpt::export_hugging_face(checkpoint, o["output"].as<std::string>(), options);
  std::cout << fmt::format("exported {} as {} to {}: {} files, {:.1f} MB of {} tensors{}\n",
                           checkpoint, r.architecture, r.directory, r.files.size(),
                           static_cast<double>(r.tensor_bytes) / 1e6, dtype,
                           r.tokenizer_copied
                               ? ", tokenizer copied"
                               : " (no tokenizer file to copy: the data was prepared "
                                 "with the bytes tokenizer or its file is gone)")
            << std::flush;
  return core::kExitOk;
}

}  // namespace l3::cli
