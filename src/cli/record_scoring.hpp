// Scoring JSONL records with a reward model (`score --input`): preference records
// {"prompt", "chosen", "rejected"} as `prep preference` reads them, or {"prompt", "response"}
// records scored alone; and the summary over a file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/prep/record_format.hpp"
#include "model/llama_model.hpp"

namespace l3::cli {

// A reward as a JSON number: the shortest decimal that reads back as the same float
// (0.1F prints as 0.1, not 0.10000000149011612).
[[nodiscard]] double json_number(float value);

struct RecordScore {
  bool pair = false;      // a preference record; else a response alone
  float chosen = 0.0F;    // the reward of the chosen side, or of the response
  float rejected = 0.0F;  // pairs only

  [[nodiscard]] bool correct() const noexcept { return chosen > rejected; }  // ties are wrong
  // {"line", "chosen", "rejected", "correct"} or {"line", "reward"}, in that order
  [[nodiscard]] nlohmann::ordered_json to_json(std::int64_t line) const;
};

// A record's token sequences: a response alone (in `chosen`), or a pair.
struct ScoringInput {
  bool pair = false;
  std::vector<std::int32_t> chosen;
  std::vector<std::int32_t> rejected;
};

// bad_input Errors say what is wrong with the record (the caller adds file:line); nothing is
// computed yet.
[[nodiscard]] ScoringInput prepare_record(const prep::RecordFormatter& formatter,
                                          const nlohmann::json& record);
// One forward pass of the reward model (for a sharded model: collective, as every pass).
[[nodiscard]] RecordScore score_prepared(model::LlamaModel& model, const ScoringInput& input,
                                         std::int32_t pad_id);
// Both.
[[nodiscard]] RecordScore score_record(model::LlamaModel& model,
                                       const prep::RecordFormatter& formatter,
                                       const nlohmann::json& record, std::int32_t pad_id);

class ScoreSummary {
 public:
  void add(const RecordScore& score);
  [[nodiscard]] std::int64_t pairs() const noexcept { return pairs_; }
  [[nodiscard]] std::int64_t responses() const noexcept { return responses_; }
  // {"pairs", "accuracy", "mean_margin"} (null without pairs), then {"responses",
  // "mean_reward"} when there were responses alone.
  [[nodiscard]] nlohmann::ordered_json to_json() const;

 private:
  std::int64_t pairs_ = 0;
  std::int64_t correct_ = 0;
  double margin_sum_ = 0.0;
  std::int64_t responses_ = 0;
  double reward_sum_ = 0.0;
};

}  // namespace l3::cli
