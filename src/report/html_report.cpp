#include "report/html_report.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <optional>
#include <utility>

#include "core/build_info.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/output_file.hpp"
#include "core/path_safety.hpp"
#include "core/phase.hpp"
#include "report/html_text.hpp"
#include "report/nice_scale.hpp"
#include "report/phase_charts.hpp"
#include "report/smoothing.hpp"

namespace l3::report {

namespace fs = std::filesystem;

namespace {

constexpr std::array kPhaseOrder = {Phase::sft, Phase::reward, Phase::dpo, Phase::grpo};

// The summary fits a 1280-pixel window: run names and model paths wrap anywhere, a parameter
// count before its trainable share, the final evaluation between its numbers.
// Two charts a row on a wide screen (2 x 560 px and the gap), one on a narrow one; the charts
// shrink with their viewBox below 560 px.
constexpr std::string_view kStyle = R"(
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222;
       background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; padding-bottom: 4px; border-bottom: 1px solid #ddd; }
p.note { color: #555; font-size: 13px; margin: 0 0 16px; max-width: 1140px; }
p.not-drawn { color: #555; font-size: 13px; margin: 0 0 8px; }
div.table { overflow-x: auto; }
table.summary { border-collapse: collapse; font-size: 13px; }
table.summary th, table.summary td { padding: 4px 6px; border-bottom: 1px solid #e4e4e4;
       text-align: left; vertical-align: top; }
table.summary th { background: #f5f5f5; font-weight: 600; }
table.summary td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.summary td.num, table.summary td.name { white-space: nowrap; }
table.summary td.parameters { white-space: normal; }
table.summary td.run, table.summary td.model { overflow-wrap: anywhere; min-width: 7em; }
table.summary td.run { min-width: 10em; }
table.summary td.eval { min-width: 12em; }
span.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
       margin-right: 6px; }
div.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 560px), 1fr));
       gap: 12px 24px; }
div.charts svg { max-width: 100%; height: auto; }
)";

std::string_view phase_title(Phase phase) {
  switch (phase) {
    case Phase::reward:
      return "Reward model";
    case Phase::dpo:
      return "DPO";
    case Phase::grpo:
      return "GRPO";
    case Phase::sft:
      break;
  }
  return "SFT";
}

std::string optional_number(const std::optional<double>& value) {
  return value ? format_number(*value) : "-";
}

// The last evaluation's main numbers: SFT loss and perplexity; reward accuracy and margin; DPO
// loss and reward accuracy.
std::string final_evaluation(const PhaseMetrics& p) {
  if (p.last_eval_step < 0) return "-";
  const auto part = [&](std::string_view name, std::string_view field) {
    return fmt::format("{} {}", name, optional_number(p.final_eval(field)));
  };
  std::string text;
  switch (p.phase) {
    case Phase::sft:
      text = part("loss", "loss") + ", " + part("perplexity", "perplexity");
      break;
    case Phase::reward:
      text = part("accuracy", "accuracy") + ", " + part("margin", "margin");
      break;
    case Phase::dpo:
      text = part("loss", "loss") + ", " + part("accuracy", "rewards/accuracies");
      break;
    case Phase::grpo:
      text = part("greedy reward", "reward");
      break;
  }
  return fmt::format("{} (step {})", text, p.last_eval_step);
}

std::string parameters_text(const RunStart& start) {
  if (!start.parameters) return "-";
  std::string text = format_count(static_cast<double>(*start.parameters));
  if (start.trainable_parameters && *start.trainable_parameters != *start.parameters) {
    text += fmt::format(" ({} trainable)",
                        format_count(static_cast<double>(*start.trainable_parameters)));
  }
  return text;
}

std::string summary_row(const RunView& view, const PhaseMetrics& p) {
  // The latest start says what the run is now; files without "run" records leave these blank.
  const RunStart none;
  const RunStart& start = p.starts.empty() ? none : p.starts.back();
  const auto or_dash = [](const std::string& text) { return text.empty() ? "-" : text; };
  const std::string steps = p.total_steps ? fmt::format("{} / {}", p.last_step, *p.total_steps)
                                          : fmt::format("{}", p.last_step);
  const bool knows_runs = !p.starts.empty();  // written by a version that records starts
  std::string row = "<tr>";
  row += fmt::format(
      R"(<td class="run" title="{0}"><span class="swatch" style="background:{1}"></span>{2}</td>)",
      escape_html(view.run->path), escape_html(view.colour), escape_html(view.label));
  row += fmt::format(R"(<td class="name">{}</td>)", phase_title(p.phase));
  // A model read from a checkpoint is named by its path: the last two parts say which (the
  // phase's directory and the step), the whole path is the cell's tooltip.
  std::string model = or_dash(start.model);
  if (const fs::path path(model); model.find('/') != std::string::npos && path.has_parent_path() &&
                                  path.parent_path().has_filename()) {
    model =
        fmt::format("…/{}/{}", path.parent_path().filename().string(), path.filename().string());
  }
  row += fmt::format(R"(<td class="model" title="{}">{}</td>)", escape_html(start.model),
                     escape_html(model));
  row += fmt::format(R"(<td class="num parameters">{}</td>)", escape_html(parameters_text(start)));
  row += fmt::format(R"(<td class="num">{}</td>)",
                     start.ranks ? fmt::format("{}", *start.ranks) : "-");
  row += fmt::format("<td>{}</td>", escape_html(or_dash(start.backend)));
  row += fmt::format(R"(<td class="num">{}</td>)", steps);
  row +=
      fmt::format(R"(<td class="num">{}</td>)", format_seconds(p.step_ms / 1000 + p.eval_seconds));
  row +=
      fmt::format(R"(<td class="num">{}</td>)", knows_runs ? fmt::format("{}", p.restarts()) : "-");
  row += fmt::format(R"(<td class="num">{}</td>)", knows_runs || !p.checkpoints.empty()
                                                       ? fmt::format("{}", p.checkpoints.size())
                                                       : "-");
  row += fmt::format(R"(<td class="eval">{}</td>)", final_evaluation(p));
  row += fmt::format(R"(<td class="num">{}</td>)", optional_number(p.final_train_loss()));
  return row + "</tr>\n";
}

std::string summary_table(std::span<const RunView> views) {
  std::string html =
      R"(<div class="table"><table class="summary"><thead><tr><th>run</th><th>phase</th>)"
      "<th>model</th><th>parameters</th><th>ranks</th><th>backend</th><th>steps</th>"
      "<th>time</th><th>restarts</th><th>checkpoints</th><th>final evaluation</th>"
      "<th>final training loss</th></tr></thead>\n<tbody>\n";
  for (const RunView& view : views) {
    for (const PhaseMetrics& p : view.run->phases) html += summary_row(view, p);
  }
  return html + "</tbody></table></div>\n";
}

// The phase's section and how many charts it holds.
std::pair<std::string, std::size_t> phase_section(Phase phase, std::span<const RunView> views) {
  const std::string name(core::phase_name(phase));
  const PhaseCharts charts = phase_charts(phase, views);
  std::string html =
      fmt::format(R"(<section data-phase="{0}" id="{0}"><h2>{1}</h2>)", name, phase_title(phase));
  // What is left out, in one line: an empty chart says nothing a line cannot.
  if (!charts.left_out.empty()) {
    html += fmt::format("\n<p class=\"not-drawn\" data-phase=\"{}\">{}.</p>", name,
                        escape_html(not_drawn_text(charts.left_out)));
  }
  html += "\n<div class=\"charts\">\n";
  for (const Chart& chart : charts.charts) html += render_svg(chart) + "\n";
  return {html + "</div></section>\n", charts.charts.size()};
}

std::vector<RunView> views_of(std::span<const RunMetrics> runs) {
  std::vector<std::string> paths;
  for (const RunMetrics& run : runs) paths.push_back(run.path);
  const std::vector<std::string> labels = run_labels(paths);
  std::vector<RunView> views;
  for (std::size_t i = 0; i < runs.size(); ++i)
    views.push_back({.run = &runs[i], .label = labels.at(i), .colour = run_colour(i)});
  return views;
}

std::vector<Phase> phases_present(std::span<const RunMetrics> runs) {
  std::vector<Phase> phases;
  for (const Phase phase : kPhaseOrder) {
    for (const RunMetrics& run : runs) {
      if (run.phase(phase) != nullptr) {
        phases.push_back(phase);
        break;
      }
    }
  }
  return phases;
}

// Refused before anything is read: what cannot be the report's file.
void check_output(const std::string& output) {
  const fs::path path(output);
  std::error_code ec;
  if (core::is_real_directory(path)) {
    throw core::bad_input("is a directory: name the report's file (e.g. DIR/report.html)",
                          {.file = output});
  }
  core::require_output_file(output, "--output");
  const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec)) {
    throw core::bad_input(fmt::format("its directory {} does not exist", parent.string()),
                          {.file = output});
  }
  if (::access(parent.c_str(), W_OK) != 0) {
    throw core::bad_input(fmt::format("cannot write into its directory {}: {}", parent.string(),
                                      core::errno_text(errno)),
                          {.file = output});
  }
}

// The report must not replace what it reports on.
void refuse_input_as_output(std::span<const RunMetrics> runs, const std::string& output) {
  std::error_code ec;
  if (!fs::exists(output, ec)) return;
  for (const RunMetrics& run : runs) {
    for (const PhaseMetrics& p : run.phases) {
      for (const std::string& file : p.files) {
        std::error_code same_error;
        if (fs::equivalent(file, output, same_error)) {
          throw core::bad_input(
              "is a metrics file the report reads: name another file for --output",
              {.file = output});
        }
      }
    }
  }
}

// The page and how many charts it holds.
std::pair<std::string, std::size_t> render_page(std::span<const RunMetrics> runs) {
  const std::vector<RunView> views = views_of(runs);
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<meta name=\"generator\" content=\"llama3-hpc {}\">\n"
      "<title>llama3-hpc report</title>\n<style>{}</style>\n</head>\n<body>\n"
      "<h1>llama3-hpc report</h1>\n",
      escape_html(core::build_info().version), kStyle);
  html += fmt::format(
      "<p class=\"note\">{} {}. Training curves: the values of each step thin and light, their "
      "exponential moving average (smoothing {}, debiased, as TensorBoard draws it) on top; "
      "evaluations as points; a step without a value (skipped) as a gap. Restarts are dashed "
      "vertical lines; checkpoints, triangles on the loss chart's step axis. Hover over a curve "
      "or mark for its name.</p>\n",
      runs.size(), runs.size() == 1 ? "run" : "runs overlaid, one colour each", kDefaultSmoothing);
  html += summary_table(views);
  std::size_t charts = 0;
  for (const Phase phase : phases_present(runs)) {
    auto [section, count] = phase_section(phase, views);
    html += section;
    charts += count;
  }
  return {html + "</body>\n</html>\n", charts};
}

}  // namespace

std::string render_report(std::span<const RunMetrics> runs) { return render_page(runs).first; }

ReportSummary write_report(std::span<const std::string> runs, const std::string& output) {
  if (runs.empty())
    throw core::usage_error("report: give at least one run (a metrics file or a directory)");
  check_output(output);
  std::vector<RunMetrics> read;
  read.reserve(runs.size());
  for (const std::string& run : runs) read.push_back(read_run(run));
  refuse_input_as_output(read, output);
  const auto [html, charts] = render_page(read);
  core::AtomicFile file(output);
  file.write(html);
  file.commit();
  ReportSummary summary{.output = output,
                        .runs = read.size(),
                        .phases = phases_present(read),
                        .charts = charts,
                        .bytes = html.size()};
  return summary;
}

}  // namespace l3::report
