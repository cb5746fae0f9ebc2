// What a training run reports: per-step metrics (global over the ranks, the same on every
// rank), evaluation results, their JSONL form (metrics.jsonl) and their one-line human form.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "train/train_config.hpp"

namespace l3::train {

struct StepMetrics {
  std::int64_t step = 0;  // optimizer steps done, this one included (1-based)
  std::int64_t total_steps = 0;
  std::int64_t epoch = 0;
  double loss = 0;  // SFT: mean CE per loss token; reward: mean Bradley-Terry loss per pair
  double lr = 0;
  double grad_norm = 0;          // before clipping
  std::int64_t tokens = 0;       // document tokens of the global batch (padding not counted)
  std::int64_t loss_tokens = 0;  // SFT: tokens in the loss
  std::int64_t pairs = 0;        // reward
  double tokens_per_s = 0;
  std::optional<double> mfu;  // model FLOPs utilisation, when the peak is known
  double data_wait_ms = 0;    // the training thread waited for data
  double step_ms = 0;
  double reduce_wait_ms = 0;  // waited for the gradient reduction after the backward pass
  double reduce_ms = 0;       // spent reducing gradients (overlapped or not)
  double gather_ms = 0;       // parameter all-gather (ZeRO-1)
  double eta_seconds = 0;
  bool skipped = false;            // loss or gradient norm not finite: no update
  std::optional<double> accuracy;  // reward: pairs with r_chosen > r_rejected
  std::optional<double> margin;    // reward: mean r_chosen - r_rejected
};

struct EvalMetrics {
  std::int64_t step = 0;
  Phase phase = Phase::sft;
  // SFT
  double loss = 0;
  double perplexity = 0;
  std::int64_t tokens = 0;
  // Reward
  double accuracy = 0;
  double margin = 0;
  double reward_mean = 0;
  double reward_std = 0;
  std::int64_t pairs = 0;
  std::int64_t skipped_samples = 0;  // too long for --seq-len
  double seconds = 0;
};

[[nodiscard]] nlohmann::json to_json(const StepMetrics& m);
[[nodiscard]] nlohmann::json to_json(const EvalMetrics& m);
// The `eval` command's object (no "kind", no step).
[[nodiscard]] nlohmann::json eval_result_json(const EvalMetrics& m);

[[nodiscard]] std::string format_step_line(const StepMetrics& m);
[[nodiscard]] std::string format_eval_line(const EvalMetrics& m);
[[nodiscard]] std::string format_duration(double seconds);  // "1h02m", "3m05s", "42s"

// metrics.jsonl, appended to (a resumed run continues the same file), one object per line,
// flushed line by line so that a crash loses nothing already reported.
class MetricsFile {
 public:
  // `resumed_at`: the step a resumed run continues from. The records of later steps (written
  // by the interrupted run after its last checkpoint, and about to be written again) are
  // dropped first, so that the file reads like one uninterrupted run's.
  explicit MetricsFile(const std::string& path, std::optional<std::int64_t> resumed_at = {});
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace l3::train
