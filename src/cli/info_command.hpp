// `llama3-hpc info`: what the job sees (ranks, nodes, CPU binding, devices, backends, library
// versions) plus a collective self-check.
#pragma once

#include "cli/command.hpp"

namespace l3::cli {

void declare_info_options(po::options_description& options,
                          po::positional_options_description& positional);
int run_info(const CommandContext& context);

}  // namespace l3::cli
