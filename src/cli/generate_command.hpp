// `llama3-hpc generate`: a continuation of a prompt (optionally a chat turn) by a language
// model loaded from a checkpoint, greedy or sampled, with a KV cache. Rank 0 only.
#pragma once

#include "cli/command.hpp"

namespace l3::cli {

void declare_generate_options(po::options_description& options,
                              po::positional_options_description& positional);
int run_generate(const CommandContext& context);

}  // namespace l3::cli
