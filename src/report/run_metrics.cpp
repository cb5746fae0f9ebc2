#include "report/run_metrics.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/phase.hpp"

namespace l3::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The fields of training records kept: those the report shows.
constexpr std::array<std::string_view, 21> kTrainFields = {"loss",
                                                           "lr",
                                                           "grad_norm",
                                                           "tokens_per_s",
                                                           "data_wait_ms",
                                                           "accuracy",
                                                           "margin",
                                                           "rewards/accuracies",
                                                           "rewards/margins",
                                                           "rewards/chosen",
                                                           "rewards/rejected",
                                                           "reward",
                                                           "completions/mean_length",
                                                           "entropy",
                                                           "kl",
                                                           "clip_ratio/region_mean",
                                                           "logp_mismatch",
                                                           "time/generation_wait_ms",
                                                           "generation/idle_ms",
                                                           "turns/mean",
                                                           "tools/call_frequency"};

constexpr std::array kPhases = {Phase::sft, Phase::reward, Phase::dpo, Phase::grpo};

const Series kNoSeries;

// A series as read: (step, value) in file order, sorted and made one per step at the end.
using Points = std::vector<std::pair<std::int64_t, double>>;

Series to_series(Points points) {
  // Stable: of two records of one step, the later stays later, and wins.
  std::stable_sort(points.begin(), points.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  Series series;
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (i + 1 < points.size() && points[i + 1].first == points[i].first) continue;
    series.steps.push_back(static_cast<double>(points[i].first));
    series.values.push_back(points[i].second);
  }
  return series;
}

// A phase being read, over the files of a run.
struct PhaseBuilder {
  PhaseMetrics metrics;
  std::map<std::string, Points, std::less<>> train;
  std::map<std::string, Points, std::less<>> eval;
  bool present = false;
};

// The fields of a record, each present with the type asked or not at all.
std::optional<std::int64_t> integer_field(const json& record, std::string_view key) {
  const auto it = record.find(key);
  if (it == record.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<std::int64_t>();
}
std::optional<double> number_field(const json& record, std::string_view key) {
  const auto it = record.find(key);
  if (it == record.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}
std::string text_field(const json& record, std::string_view key) {
  const auto it = record.find(key);
  return it != record.end() && it->is_string() ? it->get<std::string>() : std::string();
}
// A number, or NaN for null (a skipped step's loss); nothing for anything else.
std::optional<double> value_or_gap(const json& value) {
  if (value.is_number()) return value.get<double>();
  if (value.is_null()) return std::nan("");
  return std::nullopt;
}

// The phase a record's own fields say: DPO's and reward's metrics have names of their own;
// SFT's records count loss tokens and evaluate perplexity.
std::optional<Phase> phase_of_fields(const json& record) {
  if (record.contains("rewards/accuracies")) return Phase::dpo;
  if (record.contains("frac_reward_zero_std") || record.contains("reward")) return Phase::grpo;
  if (record.contains("accuracy")) return Phase::reward;
  if (record.contains("loss_tokens") || record.contains("perplexity")) return Phase::sft;
  return std::nullopt;
}

class RunReader {
 public:
  // Reads one file's records into the phases; returns how many records of ours it held.
  std::int64_t read_file(const std::string& path);
  [[nodiscard]] RunMetrics finish(const std::string& path);

 private:
  void add_run(const json& record, Phase phase);
  void add_checkpoint(const json& record, Phase phase, std::int64_t step);
  void add_train(const json& record, Phase phase, std::int64_t step);
  void add_eval(const json& record, Phase phase, std::int64_t step);
  PhaseBuilder& builder(Phase phase, const std::string& path) {
    PhaseBuilder& b = phases_.at(static_cast<std::size_t>(phase));
    b.present = true;
    b.metrics.phase = phase;
    if (b.metrics.files.empty() || b.metrics.files.back() != path) b.metrics.files.push_back(path);
    return b;
  }

  std::array<PhaseBuilder, kPhases.size()> phases_;
};

std::int64_t RunReader::read_file(const std::string& path) {
  const int fd = core::open_regular_file(path, "a metrics file");
  struct Closer {
    int fd;
    explicit Closer(int f) : fd(f) {}
    Closer(const Closer&) = delete;
    Closer& operator=(const Closer&) = delete;
    Closer(Closer&&) = delete;
    Closer& operator=(Closer&&) = delete;
    ~Closer() { ::close(fd); }
  } closer{fd};
  core::LineReader lines(
      [fd, &path](char* buffer, std::size_t n) {
        const ssize_t got = ::read(fd, buffer, n);
        if (got < 0) {
          throw core::bad_input(fmt::format("cannot read: {}", core::errno_text(errno)),
                                {.file = path});
        }
        return static_cast<std::size_t>(got);
      },
      path);
  // A record that does not say its phase belongs to the one before it in the file (a
  // checkpoint follows its steps), else to the one the file's name says, else SFT.
  const std::optional<Phase> named = phase_of_file_name(path);
  std::optional<Phase> current;
  const auto phase_for = [&](std::optional<Phase> own) {
    return own ? *own : current ? *current : named ? *named : Phase::sft;
  };
  std::int64_t records = 0;
  std::string line;
  while (lines.next(line)) {
    const json record = core::parse_json_or_discard(line);
    if (!record.is_object()) continue;  // a note, a line cut short, not JSON
    const std::string kind = text_field(record, "kind");
    const std::optional<std::int64_t> step = integer_field(record, "step");
    Phase phase = Phase::sft;
    if (kind == "run") {
      phase = phase_for(core::parse_phase(text_field(record, "phase")));
      builder(phase, path);
      add_run(record, phase);
    } else if (kind == "checkpoint" && step) {
      phase = phase_for(core::parse_phase(text_field(record, "phase")));
      builder(phase, path);
      add_checkpoint(record, phase, *step);
    } else if (kind == "train" && step) {
      phase = phase_for(phase_of_fields(record));
      builder(phase, path);
      add_train(record, phase, *step);
    } else if (kind == "eval" && step) {
      phase = phase_for(phase_of_fields(record));
      builder(phase, path);
      add_eval(record, phase, *step);
    } else {
      continue;  // not a record of ours
    }
    current = phase;
    ++records;
  }
  return records;
}

void RunReader::add_run(const json& record, Phase phase) {
  PhaseBuilder& b = phases_.at(static_cast<std::size_t>(phase));
  RunStart start;
  // Without its step, a restart is placed after the last step read.
  start.step = integer_field(record, "step").value_or(b.metrics.last_step);
  const auto resumed = record.find("resumed");
  start.resumed = resumed != record.end() && resumed->is_boolean() && resumed->get<bool>();
  start.total_steps = integer_field(record, "total_steps");
  start.ranks = integer_field(record, "ranks");
  start.parameters = integer_field(record, "parameters");
  start.trainable_parameters = integer_field(record, "trainable_parameters");
  start.model = text_field(record, "model");
  start.backend = text_field(record, "backend");
  start.host = text_field(record, "host");
  start.resumed_from = text_field(record, "resumed_from");
  if (const auto grpo = record.find("grpo"); grpo != record.end() && grpo->is_object()) {
    start.beta = number_field(*grpo, "beta");
    start.num_iterations = integer_field(*grpo, "num_iterations");
    start.max_staleness = integer_field(*grpo, "max_staleness");
  }
  if (start.total_steps) b.metrics.total_steps = start.total_steps;
  b.metrics.starts.push_back(std::move(start));
}

void RunReader::add_checkpoint(const json& record, Phase phase, std::int64_t step) {
  phases_.at(static_cast<std::size_t>(phase))
      .metrics.checkpoints.push_back({.step = step,
                                      .level = text_field(record, "level"),
                                      .seconds = number_field(record, "seconds")});
}

void RunReader::add_train(const json& record, Phase phase, std::int64_t step) {
  PhaseBuilder& b = phases_.at(static_cast<std::size_t>(phase));
  for (const std::string_view field : kTrainFields) {
    const auto it = record.find(field);
    if (it == record.end()) continue;
    if (const std::optional<double> v = value_or_gap(*it)) {
      b.train[std::string(field)].emplace_back(step, *v);
    }
  }
  ++b.metrics.train_records;
  b.metrics.last_step = std::max(b.metrics.last_step, step);
  if (const auto total = integer_field(record, "total_steps")) b.metrics.total_steps = total;
  if (const auto ms = number_field(record, "step_ms"); ms && std::isfinite(*ms) && *ms > 0)
    b.metrics.step_ms += *ms;
}

void RunReader::add_eval(const json& record, Phase phase, std::int64_t step) {
  PhaseBuilder& b = phases_.at(static_cast<std::size_t>(phase));
  PhaseMetrics& m = b.metrics;
  const bool latest = step >= m.last_eval_step;
  if (latest) {
    m.last_eval.clear();
    m.last_eval_step = step;
  }
  for (const auto& [key, value] : record.items()) {
    if (key == "kind" || key == "step") continue;
    const std::optional<double> v = value_or_gap(value);
    if (!v) continue;
    b.eval[key].emplace_back(step, *v);
    if (latest) m.last_eval[key] = *v;
  }
  ++m.eval_records;
  if (const auto s = number_field(record, "seconds"); s && std::isfinite(*s) && *s > 0)
    m.eval_seconds += *s;
}

RunMetrics RunReader::finish(const std::string& path) {
  RunMetrics run;
  run.path = path;
  for (PhaseBuilder& b : phases_) {  // in the order of kPhases
    if (!b.present) continue;
    for (auto& [key, points] : b.train) b.metrics.train[key] = to_series(std::move(points));
    for (auto& [key, points] : b.eval) b.metrics.eval[key] = to_series(std::move(points));
    run.phases.push_back(std::move(b.metrics));
  }
  return run;
}

// The metrics files of a directory, in name order: those named metrics*.jsonl, or every *.jsonl
// when none is (links to files count; FIFOs and the like do not).
std::vector<std::string> metrics_files_in(const std::string& dir) {
  std::vector<std::string> named;
  std::vector<std::string> all;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_error;
    if (!name.ends_with(".jsonl") || !it->is_regular_file(type_error)) continue;
    all.push_back(it->path().string());
    if (name.starts_with("metrics")) named.push_back(it->path().string());
  }
  if (ec) {
    throw core::bad_input(fmt::format("cannot list the directory: {}", ec.message()),
                          {.file = dir});
  }
  std::vector<std::string>& files = named.empty() ? all : named;
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::int64_t PhaseMetrics::restarts() const {
  return std::count_if(starts.begin(), starts.end(), [](const RunStart& s) { return s.resumed; });
}

std::optional<double> PhaseMetrics::final_train_loss() const {
  const Series& loss = train_series("loss");
  // The last one: a skipped step's null (NaN) does not count.
  const auto last = std::find_if(loss.values.rbegin(), loss.values.rend(),
                                 [](double v) { return std::isfinite(v); });
  if (last != loss.values.rend()) return *last;
  return std::nullopt;
}

std::optional<double> PhaseMetrics::final_eval(std::string_view field) const {
  const auto it = last_eval.find(field);
  if (it == last_eval.end() || !std::isfinite(it->second)) return std::nullopt;
  return it->second;
}

const Series& PhaseMetrics::train_series(std::string_view field) const {
  const auto it = train.find(field);
  return it == train.end() ? kNoSeries : it->second;
}

const Series& PhaseMetrics::eval_series(std::string_view field) const {
  const auto it = eval.find(field);
  return it == eval.end() ? kNoSeries : it->second;
}

const PhaseMetrics* RunMetrics::phase(Phase phase) const noexcept {
  for (const PhaseMetrics& p : phases) {
    if (p.phase == phase) return &p;
  }
  return nullptr;
}

std::optional<Phase> phase_of_file_name(const std::string& path) {
  std::string stem = fs::path(path).stem().string();  // "metrics-dpo"
  const std::size_t dash = stem.find_last_of("-_.");
  if (dash == std::string::npos) return std::nullopt;
  return core::parse_phase(std::string_view(stem).substr(dash + 1));
}

RunMetrics read_run(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    throw core::bad_input(
        "no such file or directory: give a metrics file (JSONL) or a directory "
        "holding metrics files",
        {.file = path});
  }
  RunReader reader;
  if (!fs::is_directory(status)) {
    if (reader.read_file(path) == 0) {
      throw core::bad_input(
          "holds no metrics record (JSON lines of kind \"train\", \"eval\", \"run\" or "
          "\"checkpoint\", as --metrics writes them)",
          {.file = path});
    }
    return reader.finish(path);
  }
  std::int64_t records = 0;
  for (const std::string& file : metrics_files_in(path)) records += reader.read_file(file);
  if (records == 0) {
    throw core::bad_input(
        "holds no metrics file (*.jsonl with records of kind \"train\", \"eval\", \"run\" or "
        "\"checkpoint\", as --metrics writes them)",
        {.file = path});
  }
  return reader.finish(path);
}

std::vector<std::string> run_labels(std::span<const std::string> paths) {
  // Each path's components, lexically normal, without a trailing separator or ".".
  std::vector<std::vector<std::string>> parts;
  for (const std::string& path : paths) {
    std::vector<std::string> components;
    for (const fs::path& c : fs::path(path).lexically_normal()) {
      if (!c.empty() && c != ".") components.push_back(c.string());
    }
    if (components.empty()) components.push_back(path);
    parts.push_back(std::move(components));
  }
  const auto join = [](auto begin, auto end) {
    std::string text;
    for (auto it = begin; it != end; ++it) {
      if (!text.empty() && text != "/") text += '/';
      text += *it;
    }
    return text;
  };
  std::vector<std::string> labels;
  if (parts.empty()) return labels;
  if (parts.size() == 1) {
    const auto& p = parts.front();
    labels.push_back(join(p.end() - std::min<std::ptrdiff_t>(2, std::ssize(p)), p.end()));
    return labels;
  }
  std::size_t shortest = std::numeric_limits<std::size_t>::max();
  for (const auto& p : parts) shortest = std::min(shortest, p.size());
  // Components all paths share at the front, then at the back; each keeps at least one.
  std::size_t front = 0;
  while (front + 1 < shortest && std::all_of(parts.begin(), parts.end(), [&](const auto& p) {
           return p[front] == parts.front()[front];
         }))
    ++front;
  std::size_t back = 0;
  while (front + back + 1 < shortest && std::all_of(parts.begin(), parts.end(), [&](const auto& p) {
           return p[p.size() - 1 - back] == parts.front()[parts.front().size() - 1 - back];
         }))
    ++back;
  std::map<std::string, int> seen;
  for (const auto& p : parts) {
    std::string label = join(p.begin() + static_cast<std::ptrdiff_t>(front),
                             p.end() - static_cast<std::ptrdiff_t>(back));
    // The same run given twice stays told apart: "a", "a (2)".
    const int same = ++seen[label];
    if (same > 1) label += fmt::format(" ({})", same);
    labels.push_back(std::move(label));
  }
  return labels;
}

}  // namespace l3::report
