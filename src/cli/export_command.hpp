// `llama3-hpc export --ckpt CKPT --output DIR`: a checkpoint as a Hugging Face model directory
// (ckpt/hf_export.hpp). Runs on rank 0.
#pragma once

#include <string>

#include "cli/command.hpp"

namespace l3::cli {

void declare_export_options(po::options_description& options,
                            po::positional_options_description& positional);
int run_export(const CommandContext& context);

// A LoRA checkpoint's adapters (step_dir: a step directory) written as a PEFT adapter directory
// at `output` (export --adapter). Its base_model_name_or_path is `base_model` when given, else
// the checkpoint's base when PEFT can load it (a Hugging Face model directory), else none: a
// llama3-hpc checkpoint is no model PEFT loads (the returned line says how to make one).
// Returns the line export prints.
std::string export_lora_adapter(const std::string& step_dir, const std::string& output, bool bf16,
                                bool overwrite, const std::string& base_model = "");

}  // namespace l3::cli
