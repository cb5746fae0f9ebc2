// `llama3-hpc eval`: a checkpoint over a whole dataset, one JSON object on stdout.
#pragma once

#include "cli/command.hpp"

namespace l3::cli {

void declare_eval_options(po::options_description& options,
                          po::positional_options_description& positional);
int run_eval(const CommandContext& context);

}  // namespace l3::cli
