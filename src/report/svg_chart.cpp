#include "report/svg_chart.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "report/html_text.hpp"
#include "report/nice_scale.hpp"
#include "report/smoothing.hpp"

namespace l3::report {

namespace {

// Layout, in pixels.
constexpr double kLeft = 64;         // room for the y tick labels and the y label
constexpr double kRight = 16;        // room for the last x tick label
constexpr double kTitleHeight = 24;  // the title's baseline is at 18
constexpr double kLegendRow = 16;
constexpr double kPlotHeight = 220;
constexpr double kBelowPlot = 40;  // x tick labels and the x label
constexpr double kPlotWidth = kChartWidth - kLeft - kRight;
constexpr double kCharWidth = 6.2;  // an estimate of one character at font-size 11
constexpr std::size_t kLegendLabelChars = 56;
constexpr double kFar = 1e5;  // pixels: well outside any chart

constexpr const char* kGridColour = "#e6e6e6";
constexpr const char* kAxisColour = "#888";
constexpr const char* kTextColour = "#333";

// The step or value range of the chart, over everything drawn.
struct Range {
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    min = std::min(min, v);
    max = std::max(max, v);
  }
  [[nodiscard]] bool empty() const { return min > max; }
};

struct Point {
  double x;
  double y;  // NaN: a gap
};

// From data coordinates to the SVG's pixels.
struct Frame {
  NiceScale xs;
  NiceScale ys;
  double top = 0;
  // Clamped: values at the ends of the doubles' range (a hostile file) stay numbers SVG reads.
  [[nodiscard]] double px(double x) const {
    return std::clamp(kLeft + (x - xs.lo) / (xs.hi - xs.lo) * kPlotWidth, -kFar, kFar);
  }
  [[nodiscard]] double py(double y) const {
    return std::clamp(top + (ys.hi - y) / (ys.hi - ys.lo) * kPlotHeight, -kFar, kFar);
  }
  [[nodiscard]] double bottom() const { return top + kPlotHeight; }
};

// A long label shortened in its middle, where paths differ least: "runs/2024-06-…/metrics.jsonl".
std::string shortened(const std::string& label, std::size_t limit) {
  if (label.size() <= limit) return label;
  const std::size_t head = (limit - 1) / 2;
  std::size_t tail_begin = label.size() - (limit - 1 - head);
  // Not inside a UTF-8 sequence.
  std::size_t head_end = head;
  while (head_end > 0 && (static_cast<unsigned char>(label[head_end]) & 0xC0U) == 0x80U) --head_end;
  while (tail_begin < label.size() &&
         (static_cast<unsigned char>(label[tail_begin]) & 0xC0U) == 0x80U)
    ++tail_begin;
  return label.substr(0, head_end) + "\u2026" + label.substr(tail_begin);
}

// Each pixel column's first, lowest, highest and last points, in their order (M4 aggregation:
// the line drawn through them covers the same pixels as the line through all of them). Gaps
// are kept, one per run of missing values.
std::vector<Point> decimate(std::vector<Point> points) {
  if (points.size() <= static_cast<std::size_t>(4 * kPlotWidth)) return points;
  std::vector<Point> out;
  std::size_t i = 0;
  while (i < points.size()) {
    if (std::isnan(points[i].y)) {
      if (out.empty() || !std::isnan(out.back().y)) out.push_back(points[i]);
      ++i;
      continue;
    }
    const double column = std::floor(points[i].x);
    std::size_t lowest = i;
    std::size_t highest = i;
    std::size_t j = i;
    for (; j < points.size() && !std::isnan(points[j].y) && std::floor(points[j].x) == column;
         ++j) {
      if (points[j].y > points[lowest].y) lowest = j;  // pixels: y grows downwards
      if (points[j].y < points[highest].y) highest = j;
    }
    std::vector<std::size_t> keep = {i, lowest, highest, j - 1};
    std::sort(keep.begin(), keep.end());
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    for (const std::size_t k : keep) out.push_back(points[k]);
    i = j;
  }
  return out;
}

// SVG path data through the points, a new subpath after each gap; a point alone between gaps
// becomes a dot (a zero-length segment with round caps).
std::string path_data(std::span<const Point> points) {
  std::string d;
  std::size_t in_segment = 0;
  const auto end_segment = [&] {
    if (in_segment == 1) d += "h0";
    in_segment = 0;
  };
  for (const Point& p : points) {
    if (std::isnan(p.y)) {
      end_segment();
      continue;
    }
    d += fmt::format("{}{:.1f} {:.1f}", in_segment == 0 ? 'M' : 'L', p.x, p.y);
    ++in_segment;
  }
  end_segment();
  return d;
}

std::vector<Point> to_pixels(const Frame& frame, std::span<const double> x,
                             std::span<const double> y) {
  std::vector<Point> points;
  const std::size_t n = std::min(x.size(), y.size());
  points.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) continue;
    points.push_back({frame.px(x[i]), std::isfinite(y[i]) ? frame.py(y[i]) : std::nan("")});
  }
  return points;
}

std::string render_line(const Frame& frame, const ChartLine& line) {
  const std::string colour = escape_html(line.colour);
  const std::string title = fmt::format("<title>{}</title>", escape_html(line.label));
  const char* dash = line.dashed ? R"( stroke-dasharray="5 3")" : "";
  if (line.style == ChartLine::Style::markers) {
    std::string out =
        fmt::format(R"(<g class="markers" fill="{}" stroke="#fff">{})", colour, title);
    for (const Point& p : to_pixels(frame, line.x, line.y)) {
      if (!std::isnan(p.y))
        out += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="4"/>)", p.x, p.y);
    }
    return out + "</g>";
  }
  const std::string raw = path_data(decimate(to_pixels(frame, line.x, line.y)));
  if (line.style == ChartLine::Style::plain) {
    return fmt::format(R"(<path class="line" d="{}" fill="none" stroke="{}" stroke-width="1.6" )"
                       R"(stroke-linejoin="round" stroke-linecap="round"{}>{}</path>)",
                       raw, colour, dash, title);
  }
  const std::vector<double> smooth = smooth_ema(line.y);
  return fmt::format(R"(<g class="smoothed" fill="none" stroke="{}" stroke-linejoin="round" )"
                     R"(stroke-linecap="round"{}>{})"
                     R"(<path class="raw" d="{}" stroke-width="1" stroke-opacity="0.3"/>)"
                     R"(<path class="ema" d="{}" stroke-width="1.8"/></g>)",
                     colour, dash, title, raw,
                     path_data(decimate(to_pixels(frame, line.x, smooth))));
}

// The legend's symbol, 20 pixels wide, with its left edge at x and its middle at y.
std::string legend_symbol(const LegendEntry& entry, double x, double y) {
  const std::string colour = escape_html(entry.colour);
  switch (entry.symbol) {
    case LegendEntry::Symbol::dashed_line:
      return fmt::format(
          R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="1.8" )"
          R"(stroke-dasharray="5 3"/>)",
          x, y, x + 20, y, colour);
    case LegendEntry::Symbol::marker:
      return fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="4" fill="{}" stroke="#fff"/>)",
                         x + 10, y, colour);
    case LegendEntry::Symbol::restart:
      return fmt::format(
          R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="1.2" )"
          R"(stroke-dasharray="4 3"/>)",
          x + 10, y - 6, x + 10, y + 6, colour);
    case LegendEntry::Symbol::checkpoint:
      return fmt::format(R"(<path d="M{:.1f} {:.1f}l4 7h-8z" fill="{}"/>)", x + 10, y - 4, colour);
    case LegendEntry::Symbol::line:
      break;
  }
  return fmt::format(
      R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="1.8"/>)",
      x, y, x + 20, y, colour);
}

// The legend's entries laid out in rows under the title; returns the SVG and the rows used.
std::pair<std::string, int> render_legend(std::span<const LegendEntry> legend) {
  std::string out;
  int rows = 0;
  double x = kChartWidth;  // past the end: the first entry starts a row
  for (const LegendEntry& entry : legend) {
    const std::string label = shortened(entry.label, kLegendLabelChars);
    const double width = 20 + 5 + kCharWidth * static_cast<double>(label.size()) + 14;
    if (x + width > kChartWidth - kRight && x > kLeft) {
      ++rows;
      x = kLeft;
    }
    const double y = kTitleHeight + kLegendRow * (rows - 0.5) + 2;
    out += legend_symbol(entry, x, y);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" dominant-baseline="middle">{})", x + 25, y,
                       escape_html(label));
    if (label != entry.label) out += fmt::format("<title>{}</title>", escape_html(entry.label));
    out += "</text>";
    x += width;
  }
  return {out, rows};
}

std::string render_axes(const Frame& frame) {
  std::string out = fmt::format(R"(<g class="grid" stroke="{}" stroke-width="1">)", kGridColour);
  for (const double t : frame.ys.ticks) {
    out += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}"/>)", kLeft,
                       frame.py(t), kLeft + kPlotWidth, frame.py(t));
  }
  for (const double t : frame.xs.ticks) {
    out += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}"/>)", frame.px(t),
                       frame.top, frame.px(t), frame.bottom());
  }
  out += "</g>";
  out += fmt::format(
      R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="{}"/>)",
      kLeft, frame.top, kPlotWidth, kPlotHeight, kAxisColour);
  out += R"(<g class="y-ticks" text-anchor="end" dominant-baseline="middle">)";
  for (const double t : frame.ys.ticks) {
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}">{}</text>)", kLeft - 6, frame.py(t),
                       escape_html(format_tick(t, frame.ys)));
  }
  out += R"(</g><g class="x-ticks" text-anchor="middle">)";
  for (const double t : frame.xs.ticks) {
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}">{}</text>)", frame.px(t), frame.bottom() + 15,
                       escape_html(format_tick(t, frame.xs)));
  }
  return out + "</g>";
}

std::string render_marks(const Frame& frame, const Chart& chart) {
  std::string out;
  for (const StepMark& m : chart.restarts) {
    if (!std::isfinite(m.step)) continue;
    out += fmt::format(
        R"(<line class="restart" x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="{3}" )"
        R"(stroke-width="1.2" stroke-dasharray="4 3"><title>{4}</title></line>)",
        frame.px(m.step), frame.top, frame.bottom(), escape_html(m.colour), escape_html(m.label));
  }
  for (const StepMark& m : chart.checkpoints) {
    if (!std::isfinite(m.step)) continue;
    out += fmt::format(
        R"(<path class="checkpoint" d="M{:.1f} {:.1f}l4 7h-8z" fill="{}"><title>{}</title></path>)",
        frame.px(m.step), frame.bottom() - 7, escape_html(m.colour), escape_html(m.label));
  }
  return out;
}

}  // namespace

std::string render_svg(const Chart& chart) {
  Range steps;
  Range values;
  for (const ChartLine& line : chart.lines) {
    const std::size_t n = std::min(line.x.size(), line.y.size());
    for (std::size_t i = 0; i < n; ++i) {
      if (!std::isfinite(line.y[i])) continue;
      steps.add(line.x[i]);
      values.add(line.y[i]);
    }
  }
  const bool no_data = values.empty();
  for (const auto* marks : {&chart.restarts, &chart.checkpoints}) {
    for (const StepMark& m : *marks) steps.add(m.step);
  }
  const auto [legend, rows] = render_legend(chart.legend);
  Frame frame;
  frame.top = kTitleHeight + kLegendRow * rows + 8;
  frame.xs = steps.empty() ? nice_scale(0, 1) : nice_scale(steps.min, steps.max, 6);
  frame.ys = no_data ? nice_scale(0, 1) : nice_scale(values.min, values.max, 5);
  const double height = frame.bottom() + kBelowPlot;

  std::string attributes;
  for (const auto& [name, value] : chart.attributes)
    attributes += fmt::format(R"( {}="{}")", name, escape_html(value));
  const std::string title = escape_html(chart.title);
  std::string out = fmt::format(
      R"(<svg class="chart"{} xmlns="http://www.w3.org/2000/svg" width="{}" height="{:.0f}" )"
      R"(viewBox="0 0 {} {:.0f}" role="img" aria-label="{}" font-family="system-ui, sans-serif" )"
      R"(font-size="11" fill="{}"><title>{}</title>)",
      attributes, kChartWidth, height, kChartWidth, height, title, kTextColour, title);
  out += fmt::format(R"(<text x="{}" y="18" font-size="14" font-weight="600">{}</text>)", kLeft,
                     title);
  out += legend;
  out += render_axes(frame);
  if (no_data) {
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" fill="#999">no data)"
                       R"(</text>)",
                       kLeft + kPlotWidth / 2, frame.top + kPlotHeight / 2);
  }
  out += render_marks(frame, chart);
  // Markers last: evaluation points stay visible over the training curves.
  for (const bool markers : {false, true}) {
    for (const ChartLine& line : chart.lines) {
      if ((line.style == ChartLine::Style::markers) == markers) out += render_line(frame, line);
    }
  }
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)",
                     kLeft + kPlotWidth / 2, frame.bottom() + 32, escape_html(chart.x_label));
  out += fmt::format(
      R"svg(<text transform="translate(14 {:.1f}) rotate(-90)" text-anchor="middle">{}</text>)svg",
      frame.top + kPlotHeight / 2, escape_html(chart.y_label));
  return out + "</svg>";
}

}  // namespace l3::report
