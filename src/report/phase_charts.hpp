// The charts of a phase's section of the report: which metrics a phase shows, and every run's
// series of them overlaid, one colour per run.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "l3/l3.hpp"
#include "report/run_metrics.hpp"
#include "report/svg_chart.hpp"

namespace l3::report {

// A run as the report shows it.
struct RunView {
  const RunMetrics* run = nullptr;
  std::string label;   // in legends (run_labels)
  std::string colour;  // its curves' colour
};

// The colour of the i-th run (a palette that cycles): Tableau's 10, told apart by most people.
[[nodiscard]] std::string run_colour(std::size_t index);

// A chart the phase has but the page leaves out: every run lacks its metric (GRPO's kl without
// --beta), or it cannot move in these runs (GRPO's clip ratio with --num-iterations 1).
struct LeftOutChart {
  std::string name;    // "KL to the reference", "clip ratio"
  std::string reason;  // "no --beta", "--num-iterations 1: the ratio is 1", "not recorded"
};

struct PhaseCharts {
  std::vector<Chart> charts;
  std::vector<LeftOutChart> left_out;  // in the order the charts would be
};

// The phase's charts, in the order shown: loss (training smoothed, evaluations as points,
// checkpoints on its step axis), the phase's own metrics (reward: accuracy and margin; DPO:
// rewards/accuracies, rewards/margins, rewards/chosen with rewards/rejected dashed; GRPO: the
// sampled training reward and the greedy evaluation's on separate charts, completion length,
// loss, entropy, kl, clip ratio), then the learning rate, gradient norm, tokens/s and data wait.
// Every run that has the phase is drawn; restarts are dashed vertical lines on every chart. A
// chart no run has a value for is left out, as is the clip ratio when every run says
// --num-iterations 1 (its "grpo" settings): `left_out` says which and why.
[[nodiscard]] PhaseCharts phase_charts(Phase phase, std::span<const RunView> runs);

// The one line that names the charts left out: "Not drawn: KL to the reference (no --beta),
// clip ratio (--num-iterations 1: the ratio is 1)"; "" when none is.
[[nodiscard]] std::string not_drawn_text(std::span<const LeftOutChart> left_out);

// How many charts phase_charts() gives for `phase` at most, with every metric present (5 SFT,
// 7 reward, 8 DPO, 10 GRPO).
[[nodiscard]] std::size_t chart_count(Phase phase);

}  // namespace l3::report
