// `llama3-hpc demo`: the whole pipeline on built-in data, with nothing but this repository:
// write an instruction dataset and a preference dataset, prepare them with the `bytes`
// tokenizer, fine-tune a tiny model (SFT), train a reward model from it, evaluate both, and
// say what to run next with real data.
#pragma once

#include "cli/command.hpp"

namespace l3::cli {

void declare_demo_options(po::options_description& options,
                          po::positional_options_description& positional);
int run_demo(const CommandContext& context);

}  // namespace l3::cli
