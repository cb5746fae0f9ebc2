#include "core/option_suggestion.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <utility>

namespace l3::core {

namespace {

// "--Learning_Rate" -> "learning-rate".
std::string normalised(std::string_view name) {
  while (name.starts_with('-')) name.remove_prefix(1);
  std::string out;
  out.reserve(name.size());
  for (const char c : name) {
    out.push_back(c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

// Other trainers' names (Hugging Face's TrainingArguments and generate(), TRL's configs, PEFT's
// LoraConfig, torchtune's, torchtitan's, Megatron's, llm.c's) of options this program names
// otherwise, normalised.
constexpr auto kOtherNames = std::to_array<std::pair<std::string_view, std::string_view>>({
    {"learning-rate", "lr"},
    {"lr-warmup-steps", "warmup"},
    {"warmup-steps", "warmup"},
    {"num-warmup-steps", "warmup"},
    {"max-steps", "steps"},
    {"num-train-epochs", "epochs"},
    {"num-epochs", "epochs"},
    {"per-device-train-batch-size", "micro-batch"},
    {"batch-size", "global-batch"},
    {"train-batch-size", "global-batch"},
    {"gradient-accumulation-steps", "global-batch"},
    {"max-seq-length", "seq-len"},
    {"max-length", "seq-len"},
    {"max-seq-len", "seq-len"},
    {"output-dir", "ckpt-dir"},
    {"save-steps", "checkpoint-every"},
    {"eval-steps", "eval-every"},
    {"logging-steps", "log-every"},
    {"max-grad-norm", "grad-clip"},
    {"adam-beta1", "beta1"},
    {"adam-beta2", "beta2"},
    {"adam-epsilon", "adam-eps"},
    {"lora-r", "lora-rank"},
    {"r", "lora-rank"},
    {"target-modules", "lora-targets"},
    {"resume-from-checkpoint", "resume"},
    {"model-name-or-path", "init"},
    {"lr-warmup", "warmup"},
    {"lr-warmup-iters", "warmup"},
    {"warmup-iters", "warmup"},
    {"num-steps", "steps"},
    {"training-steps", "steps"},
    {"train-iters", "steps"},
    {"lr-min", "min-lr"},
    {"min-learning-rate", "min-lr"},
    {"max-norm", "grad-clip"},
    {"clip-grad", "grad-clip"},
    {"clip-grad-norm", "grad-clip"},
    {"local-batch-size", "micro-batch"},
    {"micro-batch-size", "micro-batch"},
    {"global-batch-size", "global-batch"},
    {"seq-length", "seq-len"},
    {"checkpoint-interval", "checkpoint-every"},
    {"save-interval", "checkpoint-every"},
    {"keep-latest-k", "keep-last"},
    {"save-total-limit", "keep-last"},
    {"gradient-checkpointing", "recompute"},
    {"activation-checkpointing", "recompute"},
    {"eval-interval", "eval-every"},
    {"log-interval", "log-every"},
    {"logging-dir", "tensorboard"},
    {"train-data", "data"},
    {"dataset", "data"},
    {"eval-data", "val-data"},
    {"validation-data", "val-data"},
    {"max-new-tokens", "max-new"},
    {"num-return-sequences", "num-samples"},
});

// Optimal string alignment distance (Levenshtein with adjacent transpositions).
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

constexpr std::size_t kMaxSuggestions = 3;

}  // namespace

std::vector<std::string> likely_options(std::string_view given,
                                        std::span<const std::string> known) {
  const std::string name = normalised(given);
  if (name.empty()) return {};
  const auto is_known = [&](std::string_view candidate) {
    return std::find(known.begin(), known.end(), candidate) != known.end();
  };
  if (is_known(name)) return {name};  // --Seq_Len, seq_len
  for (const auto& [other, ours] : kOtherNames) {
    if (other == name && is_known(ours)) return {std::string(ours)};
  }
  std::vector<std::string> found;
  // Cut short: every name it begins, shortest first (--warm: --warmup).
  if (name.size() >= 3) {
    for (const std::string& candidate : known) {
      if (candidate.starts_with(name)) found.push_back(candidate);
    }
    std::sort(found.begin(), found.end(), [](const std::string& a, const std::string& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
  }
  // A typo: a distance of one per four letters, at least one, at most three. Names whose lengths
  // differ by more are never that near, and are not compared (the distance takes time and
  // memory in the product of the lengths: an 8 MB name against every option took 2 GB).
  const std::size_t limit = std::clamp<std::size_t>(name.size() / 4, 1, 3);
  std::vector<std::pair<std::size_t, std::string>> near;
  for (const std::string& candidate : known) {
    const std::size_t gap = name.size() > candidate.size() ? name.size() - candidate.size()
                                                           : candidate.size() - name.size();
    if (gap > limit) continue;
    const std::size_t distance = edit_distance(name, candidate);
    if (distance <= limit && std::find(found.begin(), found.end(), candidate) == found.end())
      near.emplace_back(distance, candidate);
  }
  std::sort(near.begin(), near.end());
  for (auto& [distance, candidate] : near) found.push_back(std::move(candidate));
  if (found.size() > kMaxSuggestions) found.resize(kMaxSuggestions);
  return found;
}

std::string shown_name(std::string_view given) {
  constexpr std::size_t kShown = 64;
  if (given.size() <= kShown) return std::string(given);
  return fmt::format("{}... ({} bytes)", given.substr(0, kShown), given.size());
}

std::string did_you_mean(std::string_view given, std::span<const std::string> known,
                         std::string_view dashes) {
  const std::vector<std::string> names = likely_options(given, known);
  if (names.empty()) return "";
  std::string text = "; did you mean ";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " or " : ", ";
    text += fmt::format("{}{}", dashes, names[i]);
  }
  return text + "?";
}

}  // namespace l3::core
