#include "report/phase_charts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

#include "core/phase.hpp"

namespace l3::report {

namespace {

// What a chart shows: a training field (and a second one, dashed, on the same chart) and the
// evaluation field of the same quantity, if any.
// A chart whose fields no run has is not drawn: the page's "Not drawn" line names it, with
// `absent` as the reason when the phase says why (GRPO's kl: only with --beta).
struct ChartSpec {
  std::string_view metric;  // its data-metric attribute
  std::string_view title;
  std::string_view y_label;
  std::string_view train_field;   // "": none (a chart of evaluations only)
  std::string_view eval_field;    // "": no evaluation points
  std::string_view dashed_field;  // "": none
  // The legend's entries for the solid and the dashed line, when there is a dashed one.
  std::string_view solid_legend = "chosen";
  std::string_view dashed_legend = "rejected";
  ChartLine::Style style = ChartLine::Style::smoothed;
  bool checkpoints = false;                     // checkpoints on its step axis (the loss chart)
  std::string_view eval_legend = "evaluation";  // the evaluations' entry in the legend
  std::string_view short_name;                  // in the "Not drawn" line; "": the title
  std::string_view absent;                      // why its fields may be absent; "": "not recorded"
  // The clip ratio: with --num-iterations 1 the policy is the one that sampled, the ratio is
  // exactly 1 and nothing is clipped; the chart of a run that says so is flat zero.
  bool fixed_with_one_iteration = false;
};

constexpr ChartSpec kLearningRate{.metric = "lr",
                                  .title = "Learning rate",
                                  .y_label = "learning rate",
                                  .train_field = "lr",
                                  .style = ChartLine::Style::plain};
constexpr ChartSpec kGradNorm{.metric = "grad_norm",
                              .title = "Gradient norm",
                              .y_label = "gradient norm",
                              .train_field = "grad_norm"};
constexpr ChartSpec kThroughput{.metric = "tokens_per_s",
                                .title = "Throughput",
                                .y_label = "tokens/s",
                                .train_field = "tokens_per_s"};
constexpr ChartSpec kDataWait{.metric = "data_wait_ms",
                              .title = "Data wait",
                              .y_label = "data wait (ms)",
                              .train_field = "data_wait_ms"};

constexpr std::array kSftCharts = {ChartSpec{.metric = "loss",
                                             .title = "Loss",
                                             .y_label = "loss (per token)",
                                             .train_field = "loss",
                                             .eval_field = "loss",
                                             .checkpoints = true},
                                   kLearningRate, kGradNorm, kThroughput, kDataWait};

constexpr std::array kRewardCharts = {ChartSpec{.metric = "loss",
                                                .title = "Loss",
                                                .y_label = "loss (Bradley-Terry)",
                                                .train_field = "loss",
                                                .checkpoints = true},
                                      ChartSpec{.metric = "accuracy",
                                                .title = "Accuracy",
                                                .y_label = "accuracy (chosen > rejected)",
                                                .train_field = "accuracy",
                                                .eval_field = "accuracy"},
                                      ChartSpec{.metric = "margin",
                                                .title = "Margin",
                                                .y_label = "reward margin",
                                                .train_field = "margin",
                                                .eval_field = "margin"},
                                      kLearningRate,
                                      kGradNorm,
                                      kThroughput,
                                      kDataWait};

constexpr std::array kDpoCharts = {ChartSpec{.metric = "loss",
                                             .title = "Loss",
                                             .y_label = "loss (DPO)",
                                             .train_field = "loss",
                                             .eval_field = "loss",
                                             .checkpoints = true},
                                   ChartSpec{.metric = "rewards/accuracies",
                                             .title = "Reward accuracy",
                                             .y_label = "rewards/accuracies",
                                             .train_field = "rewards/accuracies",
                                             .eval_field = "rewards/accuracies"},
                                   ChartSpec{.metric = "rewards/margins",
                                             .title = "Reward margin",
                                             .y_label = "rewards/margins",
                                             .train_field = "rewards/margins",
                                             .eval_field = "rewards/margins"},
                                   ChartSpec{.metric = "rewards/chosen",
                                             .title = "Rewards of chosen and rejected",
                                             .y_label = "implicit reward",
                                             .train_field = "rewards/chosen",
                                             .eval_field = "rewards/chosen",
                                             .dashed_field = "rewards/rejected"},
                                   kLearningRate,
                                   kGradNorm,
                                   kThroughput,
                                   kDataWait};

// GRPO's two rewards on axes of their own: the training reward is the mean over the sampled
// completions of the step's prompts; the evaluation's, the greedy completions' on the held-out
// prompts (its sampled one, "reward_sampled", is drawn as points on the first).
constexpr std::array kGrpoCharts = {ChartSpec{.metric = "reward",
                                              .title = "Training reward (sampled completions)",
                                              .y_label = "mean reward, sampled",
                                              .train_field = "reward",
                                              .eval_field = "reward_sampled",
                                              .checkpoints = true,
                                              .eval_legend = "evaluation, sampled",
                                              .short_name = "training reward"},
                                    ChartSpec{.metric = "eval_reward",
                                              .title = "Evaluation reward (greedy completions)",
                                              .y_label = "mean reward, greedy (held-out prompts)",
                                              .eval_field = "reward",
                                              .eval_legend = "evaluation, greedy",
                                              .short_name = "evaluation reward",
                                              .absent = "no evaluation"},
                                    ChartSpec{.metric = "completions/mean_length",
                                              .title = "Completion length",
                                              .y_label = "tokens (mean)",
                                              .train_field = "completions/mean_length"},
                                    ChartSpec{.metric = "loss",
                                              .title = "Loss",
                                              .y_label = "clipped surrogate loss",
                                              .train_field = "loss"},
                                    ChartSpec{.metric = "entropy",
                                              .title = "Entropy",
                                              .y_label = "entropy (nats per token)",
                                              .train_field = "entropy"},
                                    ChartSpec{.metric = "kl",
                                              .title = "KL to the reference",
                                              .y_label = "kl (k3, per token)",
                                              .train_field = "kl",
                                              .absent = "no --beta"},
                                    ChartSpec{.metric = "clip_ratio/region_mean",
                                              .title = "Clipped tokens",
                                              .y_label = "clip_ratio/region_mean",
                                              .train_field = "clip_ratio/region_mean",
                                              .short_name = "clip ratio",
                                              .fixed_with_one_iteration = true},
                                    ChartSpec{.metric = "time/generation_wait_ms",
                                              .title = "Waiting (asynchronous GRPO)",
                                              .y_label = "ms per step: training ranks for a "
                                                         "batch, generating ranks (dashed) for "
                                                         "weights",
                                              .train_field = "time/generation_wait_ms",
                                              .dashed_field = "generation/idle_ms",
                                              .solid_legend = "training ranks",
                                              .dashed_legend = "generating ranks",
                                              .short_name = "waiting",
                                              .absent = "no --generation-ranks"},
                                    ChartSpec{.metric = "turns/mean",
                                              .title = "Episodes (multi-turn)",
                                              .y_label = "policy turns per episode (mean), tool "
                                                         "results (dashed)",
                                              .train_field = "turns/mean",
                                              .dashed_field = "tools/call_frequency",
                                              .solid_legend = "turns",
                                              .dashed_legend = "tool results",
                                              .short_name = "turns",
                                              .absent = "no --environment"},
                                    kLearningRate,
                                    kGradNorm,
                                    kThroughput};

std::span<const ChartSpec> specs_of(Phase phase) {
  switch (phase) {
    case Phase::grpo:
      return kGrpoCharts;
    case Phase::reward:
      return kRewardCharts;
    case Phase::dpo:
      return kDpoCharts;
    case Phase::sft:
      break;
  }
  return kSftCharts;
}

constexpr const char* kNeutral = "#555";

bool has_values(const Series& s) {
  return std::any_of(s.values.begin(), s.values.end(), [](double v) { return !std::isnan(v); });
}

ChartLine line_of(const Series& s, const RunView& view, std::string what, ChartLine::Style style,
                  bool dashed = false) {
  return ChartLine{.label = fmt::format("{}: {}", view.label, what),
                   .colour = view.colour,
                   .x = s.steps,
                   .y = s.values,
                   .style = style,
                   .dashed = dashed};
}

Chart make_chart(Phase phase, const ChartSpec& spec, std::span<const RunView> runs) {
  Chart chart;
  chart.title = std::string(spec.title);
  chart.y_label = std::string(spec.y_label);
  chart.attributes = {{"data-phase", std::string(core::phase_name(phase))},
                      {"data-metric", std::string(spec.metric)}};
  bool evaluations = false;
  bool dashed = false;
  for (const RunView& view : runs) {
    const PhaseMetrics* p = view.run->phase(phase);
    if (p == nullptr) continue;
    bool drawn = false;
    if (!spec.train_field.empty()) {
      const Series& train = p->train_series(spec.train_field);
      if (has_values(train)) {
        chart.lines.push_back(
            line_of(train, view, fmt::format("training {}", spec.train_field), spec.style));
        drawn = true;
      }
    }
    if (!spec.dashed_field.empty()) {
      const Series& second = p->train_series(spec.dashed_field);
      if (has_values(second)) {
        chart.lines.push_back(
            line_of(second, view, fmt::format("training {}", spec.dashed_field), spec.style, true));
        dashed = drawn = true;
      }
    }
    for (const std::string_view field : {spec.eval_field, spec.dashed_field}) {
      if (field.empty()) continue;
      const Series& eval = p->eval_series(field);
      if (!has_values(eval)) continue;
      // A chart of evaluations only: the points joined, to follow the trend.
      if (spec.train_field.empty()) {
        chart.lines.push_back(
            line_of(eval, view, fmt::format("evaluation {}", field), ChartLine::Style::plain));
      }
      chart.lines.push_back(
          line_of(eval, view, fmt::format("evaluation {}", field), ChartLine::Style::markers));
      evaluations = drawn = true;
    }
    if (drawn) {
      chart.legend.push_back({.symbol = LegendEntry::Symbol::line,
                              .colour = view.colour,
                              .label = runs.size() > 1            ? view.label
                                       : spec.train_field.empty() ? std::string(spec.eval_legend)
                                                                  : std::string("training")});
    }
    for (const RunStart& start : p->starts) {
      if (!start.resumed) continue;
      chart.restarts.push_back(
          {.step = static_cast<double>(start.step),
           .colour = view.colour,
           .label = fmt::format("{}: resumed after step {}{}", view.label, start.step,
                                start.resumed_from.empty() ? "" : " from " + start.resumed_from)});
    }
    if (spec.checkpoints) {
      for (const CheckpointRecord& c : p->checkpoints) {
        chart.checkpoints.push_back(
            {.step = static_cast<double>(c.step),
             .colour = view.colour,
             .label = fmt::format("{}: checkpoint at step {}{}", view.label, c.step,
                                  c.level.empty() ? "" : " (" + c.level + ")")});
      }
    }
  }
  if (dashed) {
    chart.legend.push_back({.symbol = LegendEntry::Symbol::line,
                            .colour = kNeutral,
                            .label = std::string(spec.solid_legend)});
    chart.legend.push_back({.symbol = LegendEntry::Symbol::dashed_line,
                            .colour = kNeutral,
                            .label = std::string(spec.dashed_legend)});
  }
  if (evaluations && !spec.train_field.empty()) {  // (a chart of evaluations only: its lines)
    chart.legend.push_back({.symbol = LegendEntry::Symbol::marker,
                            .colour = kNeutral,
                            .label = std::string(spec.eval_legend)});
  }
  if (!chart.restarts.empty()) {
    chart.legend.push_back(
        {.symbol = LegendEntry::Symbol::restart, .colour = kNeutral, .label = "restart"});
  }
  if (!chart.checkpoints.empty()) {
    chart.legend.push_back(
        {.symbol = LegendEntry::Symbol::checkpoint, .colour = kNeutral, .label = "checkpoint"});
  }
  return chart;
}

// Whether any run has a value of the chart's fields.
bool any_values(Phase phase, const ChartSpec& spec, std::span<const RunView> runs) {
  return std::any_of(runs.begin(), runs.end(), [&](const RunView& view) {
    const PhaseMetrics* p = view.run->phase(phase);
    if (p == nullptr) return false;
    return (!spec.train_field.empty() && has_values(p->train_series(spec.train_field))) ||
           (!spec.dashed_field.empty() && (has_values(p->train_series(spec.dashed_field)) ||
                                           has_values(p->eval_series(spec.dashed_field)))) ||
           (!spec.eval_field.empty() && has_values(p->eval_series(spec.eval_field)));
  });
}

// Whether every run of the phase says it ran with --num-iterations 1 (each of its starts).
bool one_iteration_everywhere(Phase phase, std::span<const RunView> runs) {
  bool any = false;
  for (const RunView& view : runs) {
    const PhaseMetrics* p = view.run->phase(phase);
    if (p == nullptr) continue;
    if (p->starts.empty()) return false;  // a file that does not say
    for (const RunStart& start : p->starts) {
      if (start.num_iterations != 1 || start.max_staleness.value_or(0) > 0) return false;
    }
    any = true;
  }
  return any;
}

}  // namespace

std::string run_colour(std::size_t index) {
  static constexpr std::array<std::string_view, 10> kPalette = {
      "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return std::string(kPalette.at(index % kPalette.size()));
}

PhaseCharts phase_charts(Phase phase, std::span<const RunView> runs) {
  PhaseCharts out;
  for (const ChartSpec& spec : specs_of(phase)) {
    std::string name(spec.short_name.empty() ? spec.title : spec.short_name);
    if (!any_values(phase, spec, runs)) {
      out.left_out.push_back(
          {.name = std::move(name),
           .reason = std::string(spec.absent.empty() ? "not recorded" : spec.absent)});
    } else if (spec.fixed_with_one_iteration && one_iteration_everywhere(phase, runs)) {
      out.left_out.push_back(
          {.name = std::move(name), .reason = "--num-iterations 1: the ratio is 1"});
    } else {
      out.charts.push_back(make_chart(phase, spec, runs));
    }
  }
  return out;
}

std::string not_drawn_text(std::span<const LeftOutChart> left_out) {
  if (left_out.empty()) return {};
  std::string text = "Not drawn: ";
  for (std::size_t i = 0; i < left_out.size(); ++i) {
    if (i > 0) text += ", ";
    text += fmt::format("{} ({})", left_out[i].name, left_out[i].reason);
  }
  return text;
}

std::size_t chart_count(Phase phase) { return specs_of(phase).size(); }

}  // namespace l3::report
