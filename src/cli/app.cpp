#include "cli/app.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "api/train_options.hpp"
#include "cli/command.hpp"
#include "cli/run_outcome.hpp"
#include "cli/stop_signals.hpp"
#include "cli/train_command.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/option_suggestion.hpp"
#include "core/options.hpp"
#include "dist/library_versions.hpp"
#include "dist/mpi_runtime.hpp"
#include "dist/thread_budget.hpp"
#include "dist/world.hpp"
#include "kernels/backend_options.hpp"
#include "kernels/backends.hpp"

namespace l3::cli {

namespace {

constexpr std::string_view kProgram = "llama3-hpc";

// The rank the launcher gave this process, read from its environment before MPI is up, so that
// help, version and usage messages print once under `mpiexec -n 64` without initialising MPI
// (which some login nodes do not allow).
int launcher_rank() {
  for (const char* name : {"PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') {
      return std::atoi(value);
    }
  }
  return 0;
}

void print_once(std::ostream& stream, const std::string& text) {
  if (launcher_rank() == 0) stream << text << std::flush;
}

std::string top_level_help() {
  std::string text = fmt::format(
      "{0} {1}: post-train Llama 3 models (SFT, reward models, DPO, GRPO/RLOO) on MPI "
      "clusters\n\n"
      "Usage: {0} <command> [options]         e.g. mpiexec -n 4 {0} sft --config sft.ini\n"
      "       {0} <command> --help\n"
      "       {0} --version\n\nCommands:\n",
      kProgram, core::build_info().version);
  for (const Command& command : command_table()) {
    text += fmt::format("  {:<10} {}\n", command.name, command.summary);
  }
  text +=
      "\nEvery option can also be set in a config file: --config FILE, with 'key = value' lines\n"
      "(keys are the long option names, '#' starts a comment); the command line wins.\n"
      "Exit codes: 0 done, 2 bad usage or input, 75 checkpointed and stopped (requeue),\n"
      "1 internal error. Documentation: docs/CLI.md\n";
  return text;
}

std::string version_text() {
  const core::BuildInfo build = core::build_info();
  std::string text =
      fmt::format("{} {}\ncommit {}, {} build, {}{}\n", kProgram, build.version, build.git_commit,
                  build.build_type, build.compiler,
                  build.sanitizers.empty() ? "" : ", sanitizers " + build.sanitizers);
  for (const kernels::BackendReport& backend : kernels::describe_backends()) {
    text +=
        fmt::format("backend {}: {}\n", kernels::backend_name(backend.backend), backend.summary);
    if (!backend.warning.empty()) text += fmt::format("warning: {}\n", backend.warning);
  }
  for (const core::LibraryVersion& library : dist::library_versions()) {
    text += fmt::format("{}: {}\n", library.name, library.version);
  }
  return text;
}

void add_common_options(po::options_description& options) {
  options.add_options()("help,h", "show this help and exit");
  api::declare_config_and_log_options(options);
}

// A subcommand's own options, the common ones, and both together for parsing.
struct CommandOptions {
  explicit CommandOptions(const Command& command)
      : own(fmt::format("Options of '{}'", command.name)) {
    if (command.declare != nullptr) command.declare(own, positional);
    add_common_options(common);
    all.add(own).add(common);
  }
  po::options_description own;
  po::options_description common{"Common options"};
  po::options_description all;
  po::positional_options_description positional;
};

std::string command_help(const Command& command) {
  const CommandOptions options(command);
  std::ostringstream text;
  text << "Usage: " << kProgram << ' ' << command.usage << "\n\n"
       << command.summary << ".\n"
       << command.description << "\n";
  text << '\n';
  if (!options.own.options().empty()) text << options.own << '\n';
  text << options.common;
  return text.str();
}

bool wants_help(const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h") return true;
  }
  return false;
}

// Runs the subcommand inside MPI. Everything that can throw runs inside the try, so that the
// outcome of every rank reaches conclude_run().
int run_under_mpi(const Command& command, const std::vector<std::string>& args, int argc,
                  char** argv) {
  dist::MpiRuntime runtime(&argc, &argv);
  // The CLI is the edge that owns the job: the only place the program names MPI_COMM_WORLD.
  const MPI_Comm job = MPI_COMM_WORLD;
  std::optional<dist::World> world;
  dist::UniqueComm outcome_comm;
  try {
    world.emplace(job);
    outcome_comm = world->duplicate_comm();
  } catch (...) {
    const core::ErrorSummary summary = core::summarize(std::current_exception());
    std::cerr << "error: " << summary.text << '\n';
    return summary.exit_code;
  }

  RankOutcome outcome;
  try {
    const CommandOptions options(command);
    const po::variables_map values = core::parse_options(options.all, options.positional, args);
    const core::Logger log(world->rank(), world->size(), api::log_config_from(values));
    log.debug("{} {} on {} ranks, {} nodes", kProgram, command.name, world->size(),
              world->node_count());
    const dist::ThreadBudget threads = dist::apply_thread_budget(*world);
    // Said at info by the commands that compute, once their options are known to be good
    // (log_blas_core): an error is the only line a failing command prints.
    log.debug("{}", thread_choice(threads));
    core::fault_point("cli.run", world->rank());
    outcome.exit_code = command.run(CommandContext{*world, log, values, args, &threads});
    core::fault_point("cli.finished", world->rank());
  } catch (...) {
    const core::ErrorSummary summary = core::summarize(std::current_exception());
    outcome = {summary.exit_code, summary.text};
  }

  try {
    return conclude_run(outcome_comm.get(), job, outcome, error_grace_seconds(),
                        core::stderr_sink());
  } catch (...) {
    const core::ErrorSummary summary = core::summarize(std::current_exception());
    std::cerr << "error: [rank " << world->rank() << "] " << summary.text << '\n';
    dist::abort_job(job, summary.exit_code);
  }
}

}  // namespace

int run_cli(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) {
      print_once(std::cerr, top_level_help());
      return core::kExitBadInput;
    }
    const std::string& first = args.front();
    if (first == "--help" || first == "-h" || first == "help") {
      print_once(std::cout, top_level_help());
      return core::kExitOk;
    }
    if (first == "--version") {
      print_once(std::cout, version_text());
      return core::kExitOk;
    }
    const Command* command = find_command(first);
    if (command == nullptr) {
      // "sfft": did you mean sft? "--verison": --version?
      const bool option = first.starts_with('-');
      std::vector<std::string> known;
      if (option) {
        known = {"help", "version"};
      } else {
        for (const Command& c : command_table()) known.emplace_back(c.name);
      }
      print_once(std::cerr,
                 fmt::format("error: unknown {} '{}'{}; see '{} --help'\n",
                             option ? "option" : "command", core::shown_name(first),
                             core::did_you_mean(first, known, option ? "--" : ""), kProgram));
      return core::kExitBadInput;
    }
    args.erase(args.begin());
    if (wants_help(args)) {
      print_once(std::cout, command_help(*command));
      return core::kExitOk;
    }
    if (command->stops_cleanly) install_stop_signals();  // before MPI and everything else
    return run_under_mpi(*command, args, argc, argv);
  } catch (...) {
    const core::ErrorSummary summary = core::summarize(std::current_exception());
    std::cerr << "error: " << summary.text << '\n';
    return summary.exit_code;
  }
}

}  // namespace l3::cli
