// The `llama3-hpc` subcommands, registered in one table (commands.cpp). A subcommand is a name,
// a help text, its options and a run function; the CLI is a thin layer over the library.
#pragma once

#include <boost/program_options.hpp>
#include <span>
#include <string>
#include <string_view>

#include "core/log.hpp"
#include "dist/thread_budget.hpp"
#include "dist/world.hpp"

namespace l3::cli {

namespace po = boost::program_options;

struct CommandContext {
  const dist::World& world;
  const core::Logger& log;
  const po::variables_map& options;
  std::span<const std::string> args;  // the words after the command name, as given
  // The threads per rank and wait policy chosen for this process (dist/thread_budget.hpp).
  const dist::ThreadBudget* threads = nullptr;
};

// Returns an exit code: core::kExitOk or core::kExitCheckpointed. Failures are exceptions.
using RunFunction = int (*)(const CommandContext&);
// Adds the subcommand's own options (the common ones are added by the CLI).
using DeclareFunction = void (*)(po::options_description&, po::positional_options_description&);

struct Command {
  std::string_view name;
  std::string_view summary;      // one line for `llama3-hpc --help`
  std::string_view usage;        // e.g. "ckpt list|verify|prune --ckpt-dir DIR [options]"
  std::string_view description;  // a paragraph for `llama3-hpc NAME --help`
  DeclareFunction declare = nullptr;
  RunFunction run = nullptr;  // every registered command has one
  // SIGTERM, SIGUSR1 and SIGINT stop it cleanly with exit 75 (cli/stop_signals.hpp), from
  // before MPI starts: the training commands.
  bool stops_cleanly = false;
};

[[nodiscard]] std::span<const Command> command_table() noexcept;
[[nodiscard]] const Command* find_command(std::string_view name) noexcept;

}  // namespace l3::cli
