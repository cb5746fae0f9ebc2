// `llama3-hpc score`: the rewards a reward model gives to a prompt + response, or to the
// chosen and rejected sides of preference records in a JSONL file. Rank 0 only.
#pragma once

#include "cli/command.hpp"

namespace l3::cli {

void declare_score_options(po::options_description& options,
                           po::positional_options_description& positional);
int run_score(const CommandContext& context);

}  // namespace l3::cli
