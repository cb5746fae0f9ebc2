// `llama3-hpc ckpt list|verify|prune DIR`: inspect and tidy checkpoint directories. DIR is a
// checkpoint root (the --ckpt-dir of a run) or one step directory. Runs on rank 0.
#pragma once

#include "cli/command.hpp"

namespace l3::cli {

void declare_ckpt_options(po::options_description& options,
                          po::positional_options_description& positional);
int run_ckpt(const CommandContext& context);

}  // namespace l3::cli
