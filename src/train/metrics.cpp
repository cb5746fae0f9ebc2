#include "train/metrics.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <optional>

#include "core/bounded_read.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/path_safety.hpp"

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
  for (const auto& [name, value] : m.extra) j[name] = finite_or_null(value);
  return j;
}

json eval_result_json(const EvalMetrics& m) {
  if (m.phase == Phase::grpo) {
    json j = json::object();
    for (const auto& [name, value] : m.extra) j[name] = finite_or_null(value);
    return j;
  }
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
  // A phase's own: the few a person reads every step (the file has them all).
  for (const auto& [name, value] : m.extra) {
    if (name == "reward" || name == "kl" || name == "completions/mean_length")
      line +=
          fmt::format(" | {} {:.4g}", name == "completions/mean_length" ? "length" : name, value);
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
  if (m.phase == Phase::grpo) {
    std::string line = fmt::format("eval @ step {}", m.step);
    for (const auto& [name, value] : m.extra) line += fmt::format(" | {} {:.4g}", name, value);
    return line + fmt::format(" | {:.1f} s", m.seconds);
  }
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
  core::require_output_file(path, "--metrics");
  if (resumed_at && core::entry_exists(p)) drop_records_after(*resumed_at);
  out_ = std::make_unique<core::AppendedFile>(path, "--metrics");
}

namespace {

// Whether `record` is one a resumed run drops when it is of a later step: an object of kind
// "train", "eval" or "checkpoint" with a whole step number.
std::optional<std::int64_t> our_record_step(const json& record) {
  if (!record.is_object()) return std::nullopt;
  const auto kind = record.find("kind");
  const auto step = record.find("step");
  if (kind == record.end() || !kind->is_string() || step == record.end() ||
      !step->is_number_integer())
    return std::nullopt;
  const auto& k = kind->get_ref<const std::string&>();
  if (k != "train" && k != "eval" && k != "checkpoint") return std::nullopt;
  return step->get<std::int64_t>();
}

}  // namespace

void MetricsFile::drop_records_after(std::int64_t step) {
  // Dropped: our records of later steps, and a last line the crash cut short (a record of ours
  // begins with '{' and was not finished). Every other line, the user's own notes included, is
  // kept as it is.
  const int fd = core::open_regular_file(path_, "a metrics file");
  struct stat info {};
  char last = '\n';
  if (::fstat(fd, &info) == 0 && info.st_size > 0 && ::pread(fd, &last, 1, info.st_size - 1) != 1) {
    last = '\n';
  }
  core::LineReader lines(
      [fd](char* buffer, std::size_t n) {
        const ssize_t got = ::read(fd, buffer, n);
        if (got < 0) {
          throw core::internal_error(fmt::format("read error: {}", core::errno_text(errno)));
        }
        return static_cast<std::size_t>(got);
      },
      path_);
  const bool unterminated = last != '\n';
  core::AtomicFile rewritten(path_);
  bool dropped = unterminated;  // rewritten in any case: the last line needs its newline
  const auto decide = [&](const std::string& text, bool is_last) {
    const json record = core::parse_json_or_discard(text);
    if (const std::optional<std::int64_t> at = our_record_step(record); at && *at > step) {
      dropped = true;
      return;
    }
    if (is_last && unterminated && record.is_discarded() && text.starts_with('{')) return;
    rewritten.write(text);
    rewritten.write("\n");
  };
  try {
    // Each line is decided once the next is read: only the last may have been cut short.
    std::optional<std::string> held;
    std::string line;
    while (lines.next(line)) {
      if (held) decide(*held, false);
      held = std::move(line);
      line.clear();
    }
    if (held) decide(*held, true);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (dropped) rewritten.commit();
}

void MetricsFile::write(const json& record) { out_->append(record.dump() + '\n'); }

void MetricsFile::sync() { out_->sync(); }

}  // namespace l3::train
