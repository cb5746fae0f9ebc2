#include "train/metrics.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "core/durable_file.hpp"
#include "core/error.hpp"

namespace l3::train {

using nlohmann::json;

namespace {

json optional_number(const std::optional<double>& value) {
  return value ? json(*value) : json(nullptr);
}

// JSON has no NaN/Inf: a skipped step's loss is written as null.
json finite_or_null(double value) { return std::isfinite(value) ? json(value) : json(nullptr); }

}  // namespace

json to_json(const StepMetrics& m) {
  json j = {{"kind", "train"},
            {"step", m.step},
            {"total_steps", m.total_steps},
            {"epoch", m.epoch},
            {"loss", finite_or_null(m.loss)},
            {"lr", m.lr},
            {"grad_norm", finite_or_null(m.grad_norm)},
            {"tokens", m.tokens},
            {"tokens_per_s", m.tokens_per_s},
            {"mfu", optional_number(m.mfu)},
            {"data_wait_ms", m.data_wait_ms},
            {"step_ms", m.step_ms},
            {"reduce_wait_ms", m.reduce_wait_ms},
            {"reduce_ms", m.reduce_ms},
            {"gather_ms", m.gather_ms},
            {"gather_wait_ms", m.gather_wait_ms},
            {"skipped", m.skipped}};
  if (m.gathers > 0) {  // ZeRO-3
    j["gathers"] = m.gathers;
    j["gathers_prefetched"] = m.gathers_prefetched;
  }
  if (m.chosen_reward) {  // DPO, with TRL's names
    j["rewards/accuracies"] = *m.accuracy;
    j["rewards/margins"] = optional_number(m.margin);
    j["rewards/chosen"] = optional_number(m.chosen_reward);
    j["rewards/rejected"] = optional_number(m.rejected_reward);
    j["pairs"] = m.pairs;
  } else if (m.accuracy) {
    j["accuracy"] = *m.accuracy;
    j["margin"] = optional_number(m.margin);
    j["pairs"] = m.pairs;
  } else {
    j["loss_tokens"] = m.loss_tokens;
  }
  return j;
}

json eval_result_json(const EvalMetrics& m) {
  if (m.phase == Phase::sft) {
    return {{"loss", finite_or_null(m.loss)},
            {"perplexity", finite_or_null(m.perplexity)},
            {"tokens", m.tokens}};
  }
  if (m.phase == Phase::dpo) {
    return {{"loss", finite_or_null(m.loss)},        {"rewards/accuracies", m.accuracy},
            {"rewards/margins", m.margin},           {"rewards/chosen", m.chosen_reward},
            {"rewards/rejected", m.rejected_reward}, {"pairs", m.pairs}};
  }
  return {{"accuracy", m.accuracy},
          {"margin", m.margin},
          {"reward_mean", m.reward_mean},
          {"reward_std", m.reward_std},
          {"pairs", m.pairs}};
}

json to_json(const EvalMetrics& m) {
  json j = eval_result_json(m);
  j["kind"] = "eval";
  j["step"] = m.step;
  j["seconds"] = m.seconds;
  if (m.skipped_samples > 0) j["skipped_samples"] = m.skipped_samples;
  return j;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const std::int64_t s = std::llround(seconds);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string format_step_line(const StepMetrics& m) {
  std::string line = fmt::format("step {}/{} | loss {:.4f}", m.step, m.total_steps, m.loss);
  if (m.accuracy) line += fmt::format(" | acc {:.3f} | margin {:.3f}", *m.accuracy, *m.margin);
  if (m.chosen_reward) {
    line += fmt::format(" | chosen {:.3f} | rejected {:.3f}", *m.chosen_reward, *m.rejected_reward);
  }
  line +=
      fmt::format(" | lr {:.3e} | grad {:.3f} | {:.0f} tok/s", m.lr, m.grad_norm, m.tokens_per_s);
  if (m.mfu) line += fmt::format(" | mfu {:.1f}%", 100.0 * *m.mfu);
  line += fmt::format(" | data-wait {:.1f} ms | step {:.0f} ms | eta {}", m.data_wait_ms, m.step_ms,
                      format_duration(m.eta_seconds));
  if (m.skipped) line += " | SKIPPED (not finite)";
  return line;
}

std::string format_eval_line(const EvalMetrics& m) {
  if (m.phase == Phase::sft) {
    return fmt::format("eval @ step {} | loss {:.4f} | ppl {:.3f} | {} tokens | {:.1f} s", m.step,
                       m.loss, m.perplexity, m.tokens, m.seconds);
  }
  if (m.phase == Phase::dpo) {
    return fmt::format(
        "eval @ step {} | loss {:.4f} | accuracy {:.4f} | margin {:.4f} | chosen {:.4f} | "
        "rejected {:.4f} | {} pairs | {:.1f} s",
        m.step, m.loss, m.accuracy, m.margin, m.chosen_reward, m.rejected_reward, m.pairs,
        m.seconds);
  }
  return fmt::format(
      "eval @ step {} | accuracy {:.4f} | margin {:.4f} | reward {:.4f} +- {:.4f} | {} pairs | "
      "{:.1f} s",
      m.step, m.accuracy, m.margin, m.reward_mean, m.reward_std, m.pairs, m.seconds);
}

MetricsFile::MetricsFile(const std::string& path, std::optional<std::int64_t> resumed_at)
    : path_(path) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
  }
  std::error_code ec;
  if (std::filesystem::is_symlink(std::filesystem::symlink_status(p, ec))) {
    throw core::bad_input(
        "is a symbolic link: name the file itself (llama3-hpc never writes through a link it "
        "did not create)",
        {.file = path});
  }
  if (resumed_at && std::filesystem::is_regular_file(p)) {
    std::ifstream in(path);
    std::string kept;
    std::string line;
    bool dropped = false;
    while (std::getline(in, line)) {
      // A line the crash cut short, or a record of a step after the checkpoint: dropped.
      const json record = json::parse(line, nullptr, false);
      if (record.is_discarded() ||
          (record.is_object() && record.value("step", std::int64_t{0}) > *resumed_at)) {
        dropped = true;
        continue;
      }
      kept += line + '\n';
    }
    in.close();
    if (dropped) core::write_file_atomically(path, kept);
  }
  out_.open(path, std::ios::app);
  if (!out_) throw core::bad_input("cannot open for appending", {.file = path});
}

void MetricsFile::write(const json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw core::internal_error("cannot write metrics", {.file = path_});
}

}  // namespace l3::train
