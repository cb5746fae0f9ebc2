#include "cli/report_command.hpp"

#include <fmt/format.h>

#include <iostream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/phase.hpp"
#include "core/words.hpp"
#include "report/html_report.hpp"

namespace l3::cli {

void declare_report_options(po::options_description& options,
                            po::positional_options_description& positional) {
  options.add_options()(
      "run", po::value<std::vector<std::string>>()->composing()->value_name("RUN"),
      "a run: its metrics file (--metrics, JSONL) or a directory of them (a demo's workdir); "
      "positional, one or more (overlaid in the charts)")(
      "output", po::value<std::string>()->value_name("FILE.html"),
      "the HTML file to write (replaced if it exists; never a directory or a link)");
  positional.add("run", -1);
}

int run_report(const CommandContext& context) {
  const po::variables_map& o = context.options;
  if (o.count("run") == 0) {
    throw core::usage_error(
        "give at least one RUN: a metrics file or a directory of them (report RUN... --output "
        "FILE.html)");
  }
  if (o.count("output") == 0 || o["output"].as<std::string>().empty())
    throw core::usage_error("--output FILE.html is required");
  if (!context.world.is_root()) return core::kExitOk;
  const auto& runs = o["run"].as<std::vector<std::string>>();
  const report::ReportSummary summary = report::write_report(runs, o["output"].as<std::string>());
  std::string phases;
  for (const Phase phase : summary.phases)
    phases += (phases.empty() ? "" : ", ") + std::string(core::phase_name(phase));
  std::cout << fmt::format("wrote {}: {}, {} ({}), {:.0f} KB\n", summary.output,
                           core::count_of(static_cast<std::int64_t>(summary.runs), "run"),
                           core::count_of(static_cast<std::int64_t>(summary.charts), "chart"),
                           phases, static_cast<double>(summary.bytes) / 1024)
            << std::flush;
  return core::kExitOk;
}

}  // namespace l3::cli
