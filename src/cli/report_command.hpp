// `llama3-hpc report RUN... --output FILE.html`: training runs' metrics files as one
// self-contained HTML page of charts (report/html_report.hpp). Runs on rank 0.
#pragma once

#include "cli/command.hpp"

namespace l3::cli {

void declare_report_options(po::options_description& options,
                            po::positional_options_description& positional);
int run_report(const CommandContext& context);

}  // namespace l3::cli
