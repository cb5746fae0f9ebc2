// `llama3-hpc report`: training runs' metrics as one self-contained HTML page, to look at the
// curves in any browser, offline: a summary table (per run and phase: model, ranks, steps,
// time, restarts, checkpoints, final evaluation and training loss), then a section per phase
// (SFT, reward, DPO) of line charts against the step, several runs overlaid one colour each.
// Inline CSS and SVG only: no script, no network, nothing to install.
//
// The page's structure is a contract for tests and scripts: <section
// data-phase="sft|reward|dpo|grpo"> per phase present, and in it each chart an <svg class="chart"
// data-phase=... data-metric=...>, and where charts were left out (phase_charts.hpp) one
// <p class="not-drawn" data-phase=...> naming them.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "l3/l3.hpp"
#include "report/run_metrics.hpp"

namespace l3::report {

// What write_report() wrote, for the line the CLI prints.
struct ReportSummary {
  std::string output;
  std::size_t runs = 0;
  std::vector<Phase> phases;  // the sections, in page order
  std::size_t charts = 0;
  std::size_t bytes = 0;
};

// The page for runs already read, each in its own colour and named in legends by run_labels()
// of their paths. Every string from the runs (paths, model names) is escaped.
[[nodiscard]] std::string render_report(std::span<const RunMetrics> runs);

// Reads the runs (each a metrics file or a directory of them: read_run()), renders the page and
// writes it to `output` atomically: under a temporary name beside it, renamed over `output` once
// complete (core::AtomicFile), so a failure leaves no partial page and an existing one untouched.
// bad_input Error naming the path when `output` is a directory, a symbolic link (never written
// through: name the file itself) or something else than a regular file, when its directory does
// not exist, when it is one of the metrics files read, and for any run read_run() refuses.
// Runs on the calling process alone (no MPI): under mpiexec, call it on one rank.
ReportSummary write_report(std::span<const std::string> runs, const std::string& output);

}  // namespace l3::report
