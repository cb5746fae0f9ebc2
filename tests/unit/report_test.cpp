// The report (src/report): nice axis ticks and short numbers, the moving average, reading runs'
// metrics files (every record kind, nulls, notes, a line cut short, phases without "run"
// records), labels, escaping, the page's structure and its atomic writing.
#include <fmt/format.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "report/html_report.hpp"
#include "report/html_text.hpp"
#include "report/nice_scale.hpp"
#include "report/phase_charts.hpp"
#include "report/run_metrics.hpp"
#include "report/smoothing.hpp"
#include "report/svg_chart.hpp"
#include "temp_dir.hpp"

namespace fs = std::filesystem;
using l3::Phase;
using namespace l3::report;

namespace {

bool near(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(b)); }

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The error a call throws: its kind and text.
template <typename F>
std::pair<l3::core::ErrorKind, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const l3::core::Error& e) {
    return {e.kind(), e.what()};
  }
  return {l3::core::ErrorKind::internal, "no error"};
}

// An SFT run that was resumed: a start, steps (one skipped, one without a gradient norm),
// checkpoints, a restart that repeats step 3, evaluations, notes and a last line cut short.
constexpr const char* kSftRun =
    R"({"kind":"run","phase":"sft","step":0,"total_steps":6,"ranks":2,"backend":"cpu","model":"tiny","parameters":1234567,"trainable_parameters":1234567,"resumed":false,"resumed_from":null,"time":1.7e9,"host":"n1","version":"0.1.0"}
{"kind":"train","step":1,"total_steps":6,"loss":2.5,"lr":0.001,"grad_norm":1.5,"tokens":100,"tokens_per_s":1000,"mfu":null,"data_wait_ms":0.1,"step_ms":100,"skipped":false,"loss_tokens":50}
my own note: lr looked high here
{"kind":"train","step":2,"total_steps":6,"loss":null,"lr":0.001,"grad_norm":null,"tokens":100,"tokens_per_s":1000,"data_wait_ms":0.1,"step_ms":100,"skipped":true,"loss_tokens":50}
{"kind":"checkpoint","step":2,"level":"global","directory":"ckpt/step-00000002","seconds":0.5,"time":1.7e9}
{"kind":"train","step":3,"total_steps":6,"loss":9.0,"lr":0.001,"grad_norm":1.2,"step_ms":100,"loss_tokens":50}
{"kind":"run","phase":"sft","step":2,"total_steps":6,"ranks":4,"backend":"cpu","model":"tiny","resumed":true,"resumed_from":"ckpt/step-00000002"}
{"kind":"train","step":3,"total_steps":6,"loss":2.0,"lr":0.001,"grad_norm":1.1,"step_ms":100,"loss_tokens":50}
{"kind":"eval","step":3,"loss":2.2,"perplexity":9.03,"tokens":40,"seconds":1.5}
{"kind":"checkpoint","step":4,"level":"node-local","seconds":0.1}
{"kind":"other","step":4,"loss":100}
[1, 2, 3]
{"kind":"train","step":4,"total_steps":6,"loss":1.5,"lr":0.0005,"grad_norm":0.9,"step_ms":100,"loss_tokens":50}
{"kind":"eval","step":4,"loss":1.9,"perplexity":6.69,"tokens":40,"seconds":0.5}
{"kind":"train","step":5,"total_steps":6,"loss":1.)";

std::string write(const l3::test::TempDir& dir, const std::string& name, const std::string& text) {
  return dir.write(name, text);
}

}  // namespace

TEST_CASE("report: axis ticks are round numbers covering the data", "[report]") {
  NiceScale s = nice_scale(0.038, 6.26);
  CHECK(s.lo == 0);
  CHECK(s.hi == 8);
  CHECK(s.step == 2);
  CHECK(s.ticks == std::vector<double>{0, 2, 4, 6, 8});
  s = nice_scale(1, 300, 6);
  CHECK(s.ticks == std::vector<double>{0, 100, 200, 300});
  s = nice_scale(0, 3e-5);
  CHECK(near(s.step, 1e-5));
  CHECK(s.ticks.size() == 4);
  s = nice_scale(-2.27, 0.33);
  CHECK(s.lo <= -2.27);
  CHECK(s.hi >= 0.33);
  CHECK(std::find(s.ticks.begin(), s.ticks.end(), 0.0) != s.ticks.end());  // exactly 0
  for (const double t : s.ticks) CHECK(near(t / s.step, std::round(t / s.step)));
  // One value: a range around it; nothing finite: [0, 1].
  s = nice_scale(5, 5);
  CHECK(s.lo < 5);
  CHECK(s.hi > 5);
  s = nice_scale(std::nan(""), 1);
  CHECK(s.lo == 0);
  CHECK(s.hi == 1);
  s = nice_scale(1, 1 + 1e-15);  // narrower than doubles can step through
  CHECK(s.ticks.size() < 20);
}

TEST_CASE("report: numbers are written with at most 4 significant digits", "[report]") {
  CHECK(format_number(0.03846150537606314) == "0.03846");
  CHECK(format_number(13.808164724693546) == "13.81");
  CHECK(format_number(-2.2706942408129698) == "-2.271");
  CHECK(format_number(6437.717) == "6438");
  CHECK(format_number(3e-5) == "3e-5");
  CHECK(format_number(1.5e-7) == "1.5e-7");
  CHECK(format_number(30104.5) == "30.1k");
  CHECK(format_number(999999) == "1M");
  CHECK(format_number(1.5e6) == "1.5M");
  CHECK(format_number(0) == "0");
  CHECK(format_number(std::nan("")) == "-");
  CHECK(format_count(1235814400) == "1.236B");
  CHECK(format_count(124439808) == "124.4M");
  CHECK(format_count(950) == "950");
  CHECK(format_seconds(5.3) == "5.3s");
  CHECK(format_seconds(63.4) == "1m03s");
  CHECK(format_seconds(3725) == "1h02m");
  // Ticks of one axis share their form.
  NiceScale s = nice_scale(0, 1);
  CHECK(format_tick(s.ticks.at(1), s) == "0.2");
  CHECK(format_tick(s.ticks.at(0), s) == "0");
  s = nice_scale(0, 48000);
  CHECK(format_tick(s.ticks.at(1), s) == "10k");
  s = nice_scale(0, 3e-5);
  CHECK(format_tick(s.ticks.at(1), s) == "1e-5");
  s = nice_scale(-1, 1);
  for (const double t : s.ticks) CHECK(format_tick(t, s) != "-0");
}

TEST_CASE("report: the moving average is TensorBoard's, debiased, and keeps gaps", "[report]") {
  for (const double v : smooth_ema(std::vector<double>{3, 3, 3})) CHECK(near(v, 3));
  const std::vector<double> s = smooth_ema(std::vector<double>{2, std::nan(""), 4}, 0.6);
  REQUIRE(s.size() == 3);
  CHECK(near(s[0], 2));  // the first value itself, not 0.4 of it
  CHECK(std::isnan(s[1]));
  // (0.6 * 0.8 + 0.4 * 4) / (1 - 0.6^2): the gap does not count.
  CHECK(near(s[2], 3.25));
  CHECK(smooth_ema(std::vector<double>{1, 5}, 0) == std::vector<double>{1, 5});
}

TEST_CASE(
    "report: a run's records are read: starts, restarts, checkpoints, nulls, notes, a cut line",
    "[report]") {
  const l3::test::TempDir dir;
  const std::string file = write(dir, "metrics.jsonl", kSftRun);
  const RunMetrics run = read_run(file);
  CHECK(run.path == file);
  REQUIRE(run.phases.size() == 1);
  const PhaseMetrics& p = run.phases.front();
  CHECK(p.phase == Phase::sft);
  CHECK(p.files == std::vector<std::string>{file});
  REQUIRE(p.starts.size() == 2);
  CHECK(p.starts[0].model == "tiny");
  CHECK(p.starts[0].parameters == 1234567);
  CHECK(p.starts[1].ranks == 4);
  CHECK(p.starts[1].resumed);
  CHECK(p.starts[1].step == 2);
  CHECK(p.starts[1].resumed_from == "ckpt/step-00000002");
  CHECK(p.restarts() == 1);
  REQUIRE(p.checkpoints.size() == 2);
  CHECK(p.checkpoints[1].step == 4);
  CHECK(p.checkpoints[1].level == "node-local");
  // Steps 1 to 4 (step 3 twice: the later record wins; step 5 was cut short).
  const Series& loss = p.train_series("loss");
  CHECK(loss.steps == std::vector<double>{1, 2, 3, 4});
  REQUIRE(loss.values.size() == 4);
  CHECK(loss.values[0] == 2.5);
  CHECK(std::isnan(loss.values[1]));  // skipped: a gap
  CHECK(loss.values[2] == 2.0);
  CHECK(std::isnan(p.train_series("grad_norm").values.at(1)));
  CHECK(p.train_series("tokens_per_s").size() == 2);  // only where recorded
  CHECK(p.train_records == 5);
  CHECK(p.last_step == 4);
  CHECK(p.total_steps == 6);
  CHECK(near(p.step_ms, 500));
  CHECK(near(p.eval_seconds, 2));
  CHECK(p.eval_series("loss").steps == std::vector<double>{3, 4});
  CHECK(p.last_eval_step == 4);
  CHECK(p.final_eval("perplexity") == 6.69);
  CHECK(!p.final_eval("accuracy"));
  CHECK(p.final_train_loss() == 1.5);
}

TEST_CASE("report: without run records the phase comes from the records' fields or the file name",
          "[report]") {
  const l3::test::TempDir dir;
  // One file holding SFT then reward then DPO steps (one --metrics for every phase).
  const std::string mixed = write(dir, "all.jsonl",
                                  R"({"kind":"train","step":1,"loss":2.0,"loss_tokens":5}
{"kind":"eval","step":1,"loss":2.1,"perplexity":8.2,"tokens":5,"seconds":0.1}
{"kind":"train","step":1,"loss":0.7,"accuracy":0.5,"margin":0.1,"pairs":4}
{"kind":"checkpoint","step":1}
{"kind":"train","step":1,"loss":0.69,"rewards/accuracies":0.5,"rewards/margins":0.0,"rewards/chosen":0.0,"rewards/rejected":0.0,"pairs":4}
)");
  RunMetrics run = read_run(mixed);
  REQUIRE(run.phases.size() == 3);
  CHECK(run.phases[0].phase == Phase::sft);
  CHECK(run.phases[0].eval_records == 1);
  CHECK(run.phases[1].phase == Phase::reward);
  CHECK(run.phases[1].checkpoints.size() == 1);  // after the reward steps: theirs
  CHECK(run.phases[2].phase == Phase::dpo);
  CHECK(run.phases[2].train_series("rewards/chosen").size() == 1);
  // Records that do not say: the file's name does.
  fs::create_directories(dir.path() / "d");
  const std::string named = write(dir, "d/metrics-dpo.jsonl",
                                  R"({"kind":"train","step":1,"loss":0.6})"
                                  "\n");
  run = read_run(named);
  REQUIRE(run.phases.size() == 1);
  CHECK(run.phases[0].phase == Phase::dpo);
  CHECK(phase_of_file_name("runs/metrics-reward.jsonl") == Phase::reward);
  CHECK(!phase_of_file_name("runs/metrics.jsonl"));
  // Neither: SFT.
  run = read_run(write(dir, "plain.jsonl", R"({"kind":"train","step":1,"loss":0.6})"));
  CHECK(run.phases.at(0).phase == Phase::sft);
}

TEST_CASE("report: a directory is one run of its metrics files, bad runs are named", "[report]") {
  const l3::test::TempDir dir;
  fs::create_directories(dir.path() / "demo");
  write(dir, "demo/metrics-sft.jsonl", R"({"kind":"train","step":1,"loss":2,"loss_tokens":3})");
  write(dir, "demo/metrics-reward.jsonl", R"({"kind":"train","step":1,"loss":1,"accuracy":1})");
  write(dir, "demo/metrics-dpo.jsonl", "");  // not started yet: skipped
  write(dir, "demo/chat.jsonl", R"({"messages":[]})");
  write(dir, "demo/notes.txt", "hello");
  const RunMetrics run = read_run((dir.path() / "demo").string());
  REQUIRE(run.phases.size() == 2);
  CHECK(run.phases[0].phase == Phase::sft);
  CHECK(run.phases[1].phase == Phase::reward);

  fs::create_directories(dir.path() / "empty");
  write(dir, "empty/notes.txt", "hello");
  auto [kind, text] = error_of([&] { (void)read_run((dir.path() / "empty").string()); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.starts_with((dir.path() / "empty").string() + ": holds no metrics file"));

  const std::string notes = write(dir, "notes.jsonl", "just words\n{\"kind\":\"mine\"}\n");
  std::tie(kind, text) = error_of([&] { (void)read_run(notes); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.starts_with(notes + ": holds no metrics record"));

  std::tie(kind, text) = error_of([&] { (void)read_run((dir.path() / "missing").string()); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.find("missing: no such file or directory") != std::string::npos);

  const std::string fifo = (dir.path() / "fifo.jsonl").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::tie(kind, text) = error_of([&] { (void)read_run(fifo); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.starts_with(fifo + ": "));
}

TEST_CASE("report: runs are labelled by what tells their paths apart", "[report]") {
  CHECK(run_labels(std::vector<std::string>{"runs/a/metrics.jsonl", "runs/b/metrics.jsonl"}) ==
        std::vector<std::string>{"a", "b"});
  CHECK(run_labels(std::vector<std::string>{"/tmp/dm-old/"}) ==
        std::vector<std::string>{"tmp/dm-old"});
  CHECK(run_labels(std::vector<std::string>{"demo"}) == std::vector<std::string>{"demo"});
  CHECK(run_labels(std::vector<std::string>{"x/m.jsonl", "x/m.jsonl", "x/m.jsonl"}) ==
        std::vector<std::string>{"m.jsonl", "m.jsonl (2)", "m.jsonl (3)"});
  CHECK(run_labels(std::vector<std::string>{"a", "b/c"}) == std::vector<std::string>{"a", "b/c"});
}

TEST_CASE("report: text from files is escaped in HTML", "[report]") {
  CHECK(escape_html(R"(a<b&"c'd>)") == "a&lt;b&amp;&quot;c&#39;d&gt;");
  CHECK(escape_html("tab\there\x01") == "tab\there\xEF\xBF\xBD");
  CHECK(escape_html("plain/path-1.jsonl") == "plain/path-1.jsonl");
}

TEST_CASE("report: a chart draws gaps, markers, restarts, checkpoints and says when it has no data",
          "[report]") {
  Chart chart;
  chart.title = "Loss";
  chart.attributes = {{"data-phase", "sft"}, {"data-metric", "loss"}};
  chart.lines.push_back({.label = "r: loss",
                         .colour = "#1f77b4",
                         .x = {1, 2, 3, 4, 5},
                         .y = {3, 2, std::nan(""), 1.5, 1},
                         .style = ChartLine::Style::plain});
  chart.lines.push_back({.label = "r: eval",
                         .colour = "#1f77b4",
                         .x = {5},
                         .y = {1.2},
                         .style = ChartLine::Style::markers});
  chart.restarts.push_back({.step = 3, .colour = "#1f77b4", .label = "restart <&>"});
  chart.checkpoints.push_back({.step = 2, .colour = "#1f77b4", .label = "checkpoint"});
  chart.legend.push_back({.symbol = LegendEntry::Symbol::restart, .label = "restart"});
  const std::string svg = render_svg(chart);
  CHECK(svg.starts_with(R"(<svg class="chart" data-phase="sft" data-metric="loss")"));
  CHECK(svg.ends_with("</svg>"));
  const std::size_t path = svg.find(R"(<path class="line" d=")");
  REQUIRE(path != std::string::npos);
  const std::string d = svg.substr(path, svg.find('"', path + 22) - path);
  CHECK(count(d, "M") == 2);  // the gap starts a new subpath
  CHECK(count(svg, "<circle") == 1);
  CHECK(count(svg, R"(class="restart")") == 1);
  CHECK(count(svg, R"(class="checkpoint")") == 1);
  CHECK(svg.find("restart &lt;&amp;&gt;") != std::string::npos);
  CHECK(svg.find("no data") == std::string::npos);

  Chart empty;
  CHECK(render_svg(empty).find("no data") != std::string::npos);

  // The ends of the doubles' range: still numbers in the SVG, and ticks that cover them.
  Chart extreme;
  extreme.lines.push_back({.x = {1, 2, 3}, .y = {-1.7e308, 0, 1.7e308}});
  const std::string extreme_svg = render_svg(extreme);
  CHECK(!std::regex_search(extreme_svg, std::regex("(^|[^a-z])(inf|nan)($|[^a-z])")));
  const NiceScale wide = nice_scale(-1.7e308, 1.7e308);
  CHECK(std::isfinite(wide.lo));
  CHECK(std::isfinite(wide.hi));
  CHECK(wide.ticks.size() < 20);

  // 100,000 steps: drawn from each pixel column's extremes, not every point.
  Chart big;
  ChartLine line{.label = "big", .colour = "#000", .style = ChartLine::Style::smoothed};
  for (int i = 0; i < 100000; ++i) {
    line.x.push_back(i);
    line.y.push_back(std::sin(i * 0.01) + (i % 7) * 0.1);
  }
  big.lines.push_back(std::move(line));
  CHECK(render_svg(big).size() < 200000);
}

TEST_CASE("report: the page has a section per phase with its charts, runs overlaid", "[report]") {
  const l3::test::TempDir dir;
  fs::create_directories(dir.path() / "a<b&\"c");
  const std::string odd = (dir.path() / "a<b&\"c").string();
  write(dir, "a<b&\"c/metrics-sft.jsonl", kSftRun);
  write(
      dir, "a<b&\"c/metrics-reward.jsonl",
      R"({"kind":"train","step":1,"loss":0.7,"accuracy":0.5,"margin":0.1,"pairs":4,"lr":0.001,"grad_norm":1,"tokens_per_s":900,"data_wait_ms":0.1}
{"kind":"eval","step":1,"accuracy":0.75,"margin":0.2,"reward_mean":0,"reward_std":1,"pairs":8,"seconds":0.1})");
  const std::string dpo = write(
      dir, "dpo.jsonl",
      R"({"kind":"run","phase":"dpo","model":"<script>","step":0,"total_steps":2,"resumed":false}
{"kind":"train","step":1,"loss":0.69,"rewards/accuracies":0.5,"rewards/margins":0.0,"rewards/chosen":0.0,"rewards/rejected":0.0,"pairs":4,"lr":0.001,"grad_norm":1,"tokens_per_s":900,"data_wait_ms":0.1}
{"kind":"eval","step":1,"loss":0.6,"rewards/accuracies":0.7,"rewards/margins":0.3,"rewards/chosen":0.1,"rewards/rejected":-0.2,"pairs":8,"seconds":0.1})");
  const std::vector<RunMetrics> runs = {read_run(odd), read_run(dpo)};
  const std::string html = render_report(runs);
  CHECK(html.starts_with("<!DOCTYPE html>"));
  CHECK(html.find("<title>llama3-hpc report</title>") != std::string::npos);
  CHECK(count(html, "<section data-phase=") == 3);
  CHECK(count(html, R"(class="chart" data-phase="sft")") == chart_count(Phase::sft));
  CHECK(count(html, R"(class="chart" data-phase="reward")") == chart_count(Phase::reward));
  CHECK(count(html, R"(class="chart" data-phase="dpo")") == chart_count(Phase::dpo));
  CHECK(chart_count(Phase::sft) == 5);
  CHECK(chart_count(Phase::reward) == 7);
  CHECK(chart_count(Phase::dpo) == 8);
  CHECK(html.find(R"(<section data-phase="sft")") < html.find(R"(<section data-phase="dpo")"));
  // Escaped everywhere: the odd path and the model name never appear as markup.
  CHECK(html.find("a<b") == std::string::npos);
  CHECK(html.find("<script>") == std::string::npos);
  CHECK(html.find("a&lt;b&amp;&quot;c") != std::string::npos);
  CHECK(html.find("&lt;script&gt;") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);  // nothing to run
  // The summary: restarts, checkpoints, final numbers.
  CHECK(html.find("loss 1.9, perplexity 6.69 (step 4)") != std::string::npos);
  CHECK(html.find("accuracy 0.75, margin 0.2 (step 1)") != std::string::npos);
  CHECK(html.find("loss 0.6, accuracy 0.7 (step 1)") != std::string::npos);
  CHECK(count(html, R"(class="restart")") == chart_count(Phase::sft));  // on every SFT chart
  CHECK(count(html, R"(class="checkpoint")") == 2);                     // the loss chart's
}

TEST_CASE("report: no empty chart: what no run has, or cannot move, is named in one line",
          "[report]") {
  const l3::test::TempDir dir;
  const auto grpo_run = [&](const std::string& name, int iterations) {
    return read_run(write(
        dir, name,
        fmt::format(
            R"({{"kind":"run","phase":"grpo","step":0,"resumed":false,"grpo":{{"beta":0.0,"num_iterations":{}}}}}
{{"kind":"train","step":1,"loss":0.1,"reward":0.5,"completions/mean_length":4,"entropy":1,"clip_ratio/region_mean":0,"lr":0.001,"grad_norm":1,"tokens_per_s":900}}
{{"kind":"eval","step":1,"reward":0.75,"reward_sampled":0.5,"prompts":4,"seconds":0.1}})",
            iterations)));
  };
  const std::vector<RunMetrics> one = {grpo_run("one.jsonl", 1)};
  const std::vector<RunView> views = {{.run = &one[0], .label = "one", .colour = "#000"}};
  const PhaseCharts charts = phase_charts(Phase::grpo, views);
  CHECK(charts.charts.size() == chart_count(Phase::grpo) - 4);
  CHECK(not_drawn_text(charts.left_out) ==
        "Not drawn: KL to the reference (no --beta), clip ratio (--num-iterations 1: the ratio "
        "is 1), waiting (no --generation-ranks), turns (no --environment)");
  // The sampled training reward and the greedy evaluation's: two charts, two axes.
  REQUIRE(charts.charts.size() >= 2);
  CHECK(charts.charts[0].lines.front().label == "one: training reward");
  CHECK(charts.charts[1].lines.front().label == "one: evaluation reward");
  CHECK(charts.charts[0].y_label != charts.charts[1].y_label);

  // A run with two iterations beside it: its clip ratio can move, and is drawn for both.
  const std::vector<RunMetrics> two = {grpo_run("a.jsonl", 1), grpo_run("b.jsonl", 2)};
  const std::vector<RunView> both = {{.run = &two[0], .label = "a", .colour = "#000"},
                                     {.run = &two[1], .label = "b", .colour = "#111"}};
  const PhaseCharts drawn = phase_charts(Phase::grpo, both);
  CHECK(not_drawn_text(drawn.left_out) ==
        "Not drawn: KL to the reference (no --beta), waiting (no --generation-ranks), turns (no "
        "--environment)");
  CHECK(render_report(two).find(R"(<p class="not-drawn" data-phase="grpo">Not drawn: KL)") !=
        std::string::npos);
}

TEST_CASE("report: the report is written atomically, never through a link or over a directory",
          "[report]") {
  const l3::test::TempDir dir;
  const std::vector<std::string> runs = {write(dir, "metrics.jsonl", kSftRun)};
  const std::string out = (dir.path() / "report.html").string();
  const ReportSummary summary = write_report(runs, out);
  CHECK(summary.runs == 1);
  CHECK(summary.phases == std::vector<Phase>{Phase::sft});
  CHECK(summary.charts == 5);
  CHECK(fs::file_size(out) == summary.bytes);
  const auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path()))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  CHECK(entries() == std::vector<std::string>{"metrics.jsonl", "report.html"});

  // A bad run: an error naming it, the existing report untouched, no temporary left.
  std::ofstream(out) << "old";
  const std::string bad = write(dir, "bad.jsonl", "not metrics\n");
  auto [kind, text] = error_of([&] { (void)write_report(std::vector<std::string>{bad}, out); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.starts_with(bad + ": "));
  std::ifstream in(out);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "old");
  CHECK(entries() == std::vector<std::string>{"bad.jsonl", "metrics.jsonl", "report.html"});

  std::tie(kind, text) = error_of([&] { (void)write_report(runs, dir.path().string()); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.find("is a directory") != std::string::npos);

  const fs::path link = dir.path() / "link.html";
  fs::create_symlink(out, link);
  std::tie(kind, text) = error_of([&] { (void)write_report(runs, link.string()); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.find("symbolic link") != std::string::npos);

  std::tie(kind, text) = error_of([&] { (void)write_report(runs, runs.front()); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.find("a metrics file the report reads") != std::string::npos);

  std::tie(kind, text) =
      error_of([&] { (void)write_report(runs, (dir.path() / "no" / "such" / "r.html").string()); });
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.find("does not exist") != std::string::npos);
}
