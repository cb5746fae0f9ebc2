// `llama3-hpc sft` and `llama3-hpc reward`: the training driver's command line, mapped onto
// train::TrainConfig (the same fields an embedding application sets in code).
#pragma once

#include <string_view>

#include "cli/command.hpp"
#include "train/train_config.hpp"

namespace l3::cli {

void declare_sft_options(po::options_description& options,
                         po::positional_options_description& positional);
void declare_reward_options(po::options_description& options,
                            po::positional_options_description& positional);
int run_sft(const CommandContext& context);
int run_reward(const CommandContext& context);
void declare_dpo_options(po::options_description& options,
                         po::positional_options_description& positional);
int run_dpo(const CommandContext& context);
void declare_grpo_options(po::options_description& options,
                          po::positional_options_description& positional);
int run_grpo(const CommandContext& context);

// At the start of a training run, its options checked: the threads per rank chosen (and a
// warning when the node is busy with other work); then on the CPU backend (`backend`: cpu, or
// auto without a visible CUDA device) one line naming the OpenBLAS core, and a warning when it
// is a generic fallback on a CPU that can do much better (kernels/cpu/blas_core.hpp).
void log_blas_core(const CommandContext& context, std::string_view backend);
// The log line that says the threads per rank chosen and why, and the MPI wait policy.
[[nodiscard]] std::string thread_choice(const dist::ThreadBudget& threads);

}  // namespace l3::cli
