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

// The phase's charts, in the order shown: loss (training smoothed, evaluations as points,
// checkpoints on its step axis), the phase's own metrics (reward: accuracy and margin; DPO:
// rewards/accuracies, rewards/margins, rewards/chosen with rewards/rejected dashed), then the
// learning rate, gradient norm, tokens/s and data wait. Every run that has the phase is drawn;
// restarts are dashed vertical lines on every chart. A chart with nothing to draw says so.
[[nodiscard]] std::vector<Chart> phase_charts(Phase phase, std::span<const RunView> runs);

// How many charts phase_charts() gives for `phase` (5 SFT, 7 reward, 8 DPO).
[[nodiscard]] std::size_t chart_count(Phase phase);

}  // namespace l3::report
