// The built-in answer reward (`grpo --reward-match answer`) and what it compares: a prompt
// record's "answer" field against a completion, both stripped of surrounding whitespace.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace l3::train::grpo {

// The completion a record's "answer" field expects: a string as it is, a number as JSON writes it
// (42 is "42"); nullopt for none, null, a boolean, a list or an object (docs/TRAINING.md).
[[nodiscard]] std::optional<std::string> expected_answer(const nlohmann::json& record);

// 1 when the completion, stripped, equals the expected answer, stripped; else 0 (also when the
// record has no answer).
[[nodiscard]] double answer_match(const nlohmann::json& record, std::string_view completion);

}  // namespace l3::train::grpo
