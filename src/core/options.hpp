// Command line + config file parsing on Boost.Program_options.
//
// Every option a subcommand accepts on its command line can also come from `--config FILE`:
// `key = value` lines whose keys are the long option names, `#` comments, no sections.
// The command line wins over the file. Abbreviated option names are not accepted (an option
// added later must never change what an old command line means).
#pragma once

#include <boost/program_options.hpp>
#include <span>
#include <string>

namespace l3::core {

namespace po = boost::program_options;

// Parses `args` (the words after the subcommand name) against `options` (which must declare
// "config" for config files to be read). Errors: usage Error for the command line, bad_input
// Error naming the file for the config file.
[[nodiscard]] po::variables_map parse_options(const po::options_description& options,
                                              const po::positional_options_description& positional,
                                              std::span<const std::string> args);

}  // namespace l3::core
