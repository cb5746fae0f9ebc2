// What the library keeps of an l3::RunConfig: the parsed options and what they configure.
#pragma once

#include <boost/program_options.hpp>

#include "core/log.hpp"
#include "l3/l3.hpp"
#include "train/train_config.hpp"

namespace l3 {

struct RunConfig::Parsed {
  boost::program_options::variables_map values;
  train::TrainConfig train;
  core::LogConfig log;
};

}  // namespace l3
