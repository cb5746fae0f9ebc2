// The `llama3-hpc` program: help and version, subcommand dispatch, MPI setup, and the edge
// where exceptions become one-line messages and exit codes.
#pragma once

namespace l3::cli {

int run_cli(int argc, char** argv);

}  // namespace l3::cli
