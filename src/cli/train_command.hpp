// `llama3-hpc sft` and `llama3-hpc reward`: the training driver's command line, mapped onto
// train::TrainConfig (the same fields an embedding application sets in code).
#pragma once

#include "cli/command.hpp"
#include "train/train_config.hpp"

namespace l3::cli {

void declare_sft_options(po::options_description& options,
                         po::positional_options_description& positional);
void declare_reward_options(po::options_description& options,
                            po::positional_options_description& positional);
int run_sft(const CommandContext& context);
int run_reward(const CommandContext& context);

}  // namespace l3::cli
