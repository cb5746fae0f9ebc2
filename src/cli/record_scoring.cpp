#include "cli/record_scoring.hpp"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "core/error.hpp"
#include "train/reward_scores.hpp"

namespace l3::cli {

using nlohmann::json;
using nlohmann::ordered_json;

double json_number(float value) { return std::stod(fmt::format("{}", value)); }

ordered_json RecordScore::to_json(std::int64_t line) const {
  if (!pair) return {{"line", line}, {"reward", json_number(chosen)}};
  return {{"line", line},
          {"chosen", json_number(chosen)},
          {"rejected", json_number(rejected)},
          {"correct", correct()}};
}

ScoringInput prepare_record(const prep::RecordFormatter& formatter, const json& record) {
  if (!record.is_object()) throw core::bad_input("a record must be a JSON object");
  if (record.contains("response")) {
    return {.pair = false, .chosen = formatter.response(record).tokens, .rejected = {}};
  }
  if (!record.contains("chosen") && !record.contains("rejected")) {
    throw core::bad_input(
        R"(expected a preference record {"prompt", "chosen", "rejected"} or {"prompt", "response"})");
  }
  prep::PreferenceExample example = formatter.preference(record);
  return {.pair = true,
          .chosen = std::move(example.chosen.tokens),
          .rejected = std::move(example.rejected.tokens)};
}

RecordScore score_prepared(model::LlamaModel& model, const ScoringInput& input,
                           std::int32_t pad_id) {
  if (!input.pair) {
    return {.pair = false, .chosen = train::sequence_reward(model, input.chosen, pad_id)};
  }
  const train::PairRewards r = train::pair_rewards(model, input.chosen, input.rejected, pad_id);
  return {.pair = true, .chosen = r.chosen, .rejected = r.rejected};
}

RecordScore score_record(model::LlamaModel& model, const prep::RecordFormatter& formatter,
                         const json& record, std::int32_t pad_id) {
  return score_prepared(model, prepare_record(formatter, record), pad_id);
}

void ScoreSummary::add(const RecordScore& score) {
  if (score.pair) {
    ++pairs_;
    correct_ += score.correct() ? 1 : 0;
    margin_sum_ += static_cast<double>(score.chosen) - static_cast<double>(score.rejected);
  } else {
    ++responses_;
    reward_sum_ += static_cast<double>(score.chosen);
  }
}

ordered_json ScoreSummary::to_json() const {
  const auto mean = [](double sum, std::int64_t count) {
    return count == 0 ? ordered_json(nullptr) : ordered_json(sum / static_cast<double>(count));
  };
  ordered_json out = {{"pairs", pairs_},
                      {"accuracy", mean(static_cast<double>(correct_), pairs_)},
                      {"mean_margin", mean(margin_sum_, pairs_)}};
  if (responses_ > 0) {
    out["responses"] = responses_;
    out["mean_reward"] = mean(reward_sum_, responses_);
  }
  return out;
}

}  // namespace l3::cli
