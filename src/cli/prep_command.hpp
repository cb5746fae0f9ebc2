// `llama3-hpc prep sft|preference`: JSONL -> HDF5 shards (io/prep/prep_job.hpp).
#pragma once

#include "cli/command.hpp"

namespace l3::cli {

void declare_prep_options(po::options_description& options,
                          po::positional_options_description& positional);
int run_prep(const CommandContext& context);

}  // namespace l3::cli
