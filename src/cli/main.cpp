// llama3-hpc: the command-line client of the llama3_hpc library.
#include "cli/app.hpp"

int main(int argc, char** argv) { return l3::cli::run_cli(argc, argv); }
