// A training run's metrics, read from its metrics files into series per phase, for the report
// (html_report.hpp). A run is a metrics file (JSONL, one record per line, as train/metrics.cpp
// writes it) or a directory of them (the demo's workdir: metrics-sft.jsonl, metrics-reward.jsonl,
// metrics-dpo.jsonl), its phases each in a file or all in one.
//
// Records are objects with a "kind": "train" (a step), "eval" (an evaluation), "run" (a start
// or restart: phase, model, ranks, ...) and "checkpoint" (a checkpoint committed). Files written
// before "run" and "checkpoint" existed are read too. Lines that are not such records (a user's
// notes, a last line a crash cut short) are skipped, as are fields a record lacks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "l3/l3.hpp"

namespace l3::report {

// Values against the step, in step order, one per step: when a step appears twice (a run
// restarted from an earlier checkpoint into the same file without dropping its records), the
// later record wins. NaN where a record has null (a skipped step's loss): a gap, not a zero.
struct Series {
  std::vector<double> steps;
  std::vector<double> values;
  [[nodiscard]] bool empty() const noexcept { return steps.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return steps.size(); }
};

// A "run" record: a run started (fresh, step 0) or resumed (after step `step`).
struct RunStart {
  std::int64_t step = 0;
  bool resumed = false;
  std::optional<std::int64_t> total_steps;
  std::optional<std::int64_t> ranks;
  std::optional<std::int64_t> parameters;
  std::optional<std::int64_t> trainable_parameters;
  std::string model;  // "" when the record does not say; the same for the strings below
  std::string backend;
  std::string host;
  std::string resumed_from;
  // GRPO's settings as the record's "grpo" object gives them (absent from other phases and
  // from files written before runs recorded them): what the report needs to tell a metric
  // that cannot move in this run (clipping with one iteration) from one that did not.
  std::optional<double> beta;
  std::optional<std::int64_t> num_iterations;
  // Asynchronous GRPO's lag (0 when synchronous, and in files before it was recorded): with a
  // lag the ratio moves even with one iteration.
  std::optional<std::int64_t> max_staleness;
};

// A "checkpoint" record.
struct CheckpointRecord {
  std::int64_t step = 0;
  std::string level;  // "global", "node-local", or "" when not given
  std::optional<double> seconds;
};

// Everything read about one phase of a run.
struct PhaseMetrics {
  Phase phase = Phase::sft;
  std::vector<std::string> files;  // the files its records came from, in reading order
  std::vector<RunStart> starts;    // its "run" records, in file order
  std::vector<CheckpointRecord> checkpoints;
  // Training steps by field ("loss", "lr", "grad_norm", "tokens_per_s", "data_wait_ms",
  // "accuracy", "margin", "rewards/accuracies", ...): the fields the report shows.
  std::map<std::string, Series, std::less<>> train;
  // Evaluations by field: every number of an eval record but its step ("loss", "perplexity",
  // "accuracy", "rewards/margins", "seconds", ...).
  std::map<std::string, Series, std::less<>> eval;
  std::int64_t train_records = 0;
  std::int64_t eval_records = 0;
  std::int64_t last_step = 0;               // the highest training step
  std::optional<std::int64_t> total_steps;  // the last record's that says
  double step_ms = 0;                       // summed over the training records
  double eval_seconds = 0;                  // summed over the evaluation records
  // The last evaluation (the highest step; of two at one step, the later): its numbers by field.
  std::int64_t last_eval_step = -1;
  std::map<std::string, double, std::less<>> last_eval;

  // The restarts: "run" records that resumed.
  [[nodiscard]] std::int64_t restarts() const;
  // The last finite training loss, if any.
  [[nodiscard]] std::optional<double> final_train_loss() const;
  // The last evaluation's `field` (the eval record with the highest step), if it has one.
  [[nodiscard]] std::optional<double> final_eval(std::string_view field) const;
  // A series, or an empty one.
  [[nodiscard]] const Series& train_series(std::string_view field) const;
  [[nodiscard]] const Series& eval_series(std::string_view field) const;
};

struct RunMetrics {
  std::string path;                  // as given
  std::vector<PhaseMetrics> phases;  // the phases present, in the order sft, reward, dpo

  [[nodiscard]] const PhaseMetrics* phase(Phase phase) const noexcept;
};

// Reads a run: a metrics file, or a directory whose metrics files (`metrics*.jsonl`, or every
// `*.jsonl` when none is named so) are read in name order, skipping those holding no record.
// bad_input Error naming the file or directory when it cannot be read, is neither a regular file
// nor a directory, or holds no record of ours.
[[nodiscard]] RunMetrics read_run(const std::string& path);

// The phase a file's name says ("metrics-dpo.jsonl": dpo), if any: used for records that do not
// say themselves.
[[nodiscard]] std::optional<Phase> phase_of_file_name(const std::string& path);

// Short names for runs, for legends: their paths without the leading and trailing components
// they all share ("runs/a/metrics.jsonl" and "runs/b/metrics.jsonl": "a" and "b"); a single
// run's path keeps its last two components.
[[nodiscard]] std::vector<std::string> run_labels(std::span<const std::string> paths);

}  // namespace l3::report
