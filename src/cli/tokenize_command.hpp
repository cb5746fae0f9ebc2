// `llama3-hpc tokenize`: JSONL {"text": ...} on stdin -> {"ids": [...]} on stdout, one per line.
#pragma once

#include "cli/command.hpp"

namespace l3::cli {

void declare_tokenize_options(po::options_description& options,
                              po::positional_options_description& positional);
int run_tokenize(const CommandContext& context);

}  // namespace l3::cli
