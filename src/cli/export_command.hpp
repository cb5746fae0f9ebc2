// `llama3-hpc export --ckpt CKPT --output DIR`: a checkpoint as a Hugging Face model directory
// (ckpt/hf_export.hpp). Runs on rank 0.
#pragma once

#include "cli/command.hpp"

namespace l3::cli {

void declare_export_options(po::options_description& options,
                            po::positional_options_description& positional);
int run_export(const CommandContext& context);

}  // namespace l3::cli
