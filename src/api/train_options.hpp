// The options of a training run (`llama3-hpc sft|reward`, l3::RunConfig): their declarations,
// defaults and help, and their mapping onto train::TrainConfig. One definition for the CLI and
// the public API, so that a config file means the same in both.
#pragma once

#include <boost/program_options.hpp>

#include "core/log.hpp"
#include "train/train_config.hpp"

namespace l3::api {

namespace po = boost::program_options;

// The options of `phase` (sft: the common ones; reward: also its loss options).
void declare_train_options(po::options_description& options, train::Phase phase);
// --config FILE, --log-level, --log-all-ranks: every command has them.
void declare_config_and_log_options(po::options_description& options);

// The options as a TrainConfig (usage Errors for values that cannot be right). With
// `data_may_come_from_host`, a missing --data is accepted (an embedding host may give a
// DataSource instead; the Session checks), and --steps is then required.
[[nodiscard]] train::TrainConfig train_config_from(const po::variables_map& options,
                                                   train::Phase phase,
                                                   bool data_may_come_from_host = false);
[[nodiscard]] core::LogConfig log_config_from(const po::variables_map& values);

}  // namespace l3::api
