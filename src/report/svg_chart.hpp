// A line chart against the training step as one inline SVG element: round ticks on both axes
// (nice_scale.hpp), grid lines, axis labels, a legend, curves with gaps where a value is missing,
// evaluation points as markers, restarts as dashed vertical lines and checkpoints as ticks on
// the x axis. Plain SVG with presentation attributes: it shows without CSS or JavaScript.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace l3::report {

// One curve (or set of points) of a chart.
struct ChartLine {
  enum class Style {
    plain,     // one line (the learning rate: not noisy)
    smoothed,  // the raw values thin and light, their moving average (smoothing.hpp) on top
    markers,   // a circle per point, no line (evaluations)
  };
  std::string label;   // shown on hover: "runs/a: train loss"
  std::string colour;  // a CSS colour, "#1f77b4"
  std::vector<double> x;
  std::vector<double> y;  // NaN: no value at that step, a gap in the line
  Style style = Style::plain;
  bool dashed = false;  // a second series of the same run on one chart (DPO's rejected rewards)
};

// A step to mark: a restart (a dashed vertical line across the plot) or a checkpoint (a small
// triangle on the x axis).
struct StepMark {
  double step = 0;
  std::string colour;
  std::string label;  // shown on hover: "runs/a: resumed after step 200"
};

struct LegendEntry {
  enum class Symbol { line, dashed_line, marker, restart, checkpoint };
  Symbol symbol = Symbol::line;
  std::string colour;
  std::string label;
};

struct Chart {
  std::string title;             // "Loss"
  std::string y_label;           // "loss"
  std::string x_label = "step";  // the x axis is always the step
  std::vector<ChartLine> lines;
  std::vector<StepMark> restarts;
  std::vector<StepMark> checkpoints;
  std::vector<LegendEntry> legend;
  // Attributes of the <svg> element besides class="chart" (values escaped when written):
  // data-phase, data-metric, which tests and scripts select on.
  std::vector<std::pair<std::string, std::string>> attributes;
};

inline constexpr int kChartWidth = 560;

// The chart as an <svg class="chart" ...> element, kChartWidth pixels wide (its height grows
// with the legend's rows). A curve with more points than the plot has pixels is drawn from
// each pixel column's first, lowest, highest and last points, which rasterises the same.
[[nodiscard]] std::string render_svg(const Chart& chart);

}  // namespace l3::report
