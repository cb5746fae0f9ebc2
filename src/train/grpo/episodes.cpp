#include "train/grpo/episodes.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/timer.hpp"

namespace l3::train::grpo {

using nlohmann::json;

namespace {

// The conversation a prompt record starts: its "messages", or its "prompt" as a user's turn.
json prompt_messages(const json& record) {
  if (const auto m = record.find("messages"); m != record.end()) return *m;
  return json::array({{{"role", "user"}, {"content", record.value("prompt", json(""))}}});
}

}  // namespace

EpisodeRunner::EpisodeRunner(Environment& environment, const tokenizer::Tokenizer& tokenizer,
                             EpisodeLimits limits)
    : environment_(environment),
      tokenizer_(tokenizer),
      formatter_(tokenizer, prep::FormatOptions{}),
      limits_(limits) {}

std::vector<Completion> EpisodeRunner::run(model::GenerationEngine& engine, const PromptSet& set,
                                           const std::vector<std::int64_t>& mine,
                                           std::int64_t samples,
                                           const model::GenerationEngine::PassAgreement& agree,
                                           EpisodeOutcome& outcome) {
  const auto per = static_cast<std::size_t>(samples);
  std::unordered_map<std::int64_t, std::size_t> position;  // a prompt appears once
  for (std::size_t i = 0; i < mine.size(); ++i) position[mine[i]] = i;
  std::vector<Completion> out(mine.size() * per);
  std::vector<json> records(mine.size());
  std::vector<json> conversations(out.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    records[i] = core::parse_json(set.record(mine[i]), "", {});
    for (std::size_t k = 0; k < per; ++k) {
      Completion& c = out[i * per + k];
      c.prompt = mine[i];
      c.sample = static_cast<std::int64_t>(k);
      c.turns = 0;
      c.policy.reserve(static_cast<std::size_t>(limits_.max_tokens));
      conversations[i * per + k] = prompt_messages(records[i]);
    }
  }
  std::size_t next = 0;
  const model::GenerationEngine::RequestSource source =
      [&]() -> std::optional<model::GenerationRequest> {
    // After a failure no episode starts: the rank's remaining ones end at their next turn.
    if (next == out.size() || outcome.failure) return std::nullopt;
    const std::size_t i = next++;
    const std::span<const std::int32_t> ids = set.prompt(mine[i / per]);
    return model::GenerationRequest{.record = mine[i / per],
                                    .sample = static_cast<std::int64_t>(i % per),
                                    .prompt = std::vector<std::int32_t>(ids.begin(), ids.end()),
                                    .max_new = limits_.max_tokens};
  };
  const model::GenerationEngine::TurnEnd turn_end =
      [&](model::GenerationOutput&& turn) -> std::optional<model::GenerationEngine::Continuation> {
    const std::size_t p = position.at(turn.record);
    const std::size_t index = p * per + static_cast<std::size_t>(turn.sample);
    Completion& c = out[index];
    json& conversation = conversations[index];
    // The policy's turn: its tokens and the stop token it ended on, as drawn.
    for (std::size_t k = 0; k < turn.tokens.size(); ++k) {
      c.ids.push_back(turn.tokens[k]);
      c.logprobs.push_back(turn.logprobs[k]);
      c.policy.push_back(1);
    }
    if (turn.stop_token >= 0) {
      c.ids.push_back(turn.stop_token);
      c.logprobs.push_back(turn.stop_logprob);
      c.policy.push_back(1);
    }
    c.text = tokenizer_.decode(turn.tokens);
    ++c.turns;
    conversation.push_back({{"role", "assistant"}, {"content", c.text}});
    if (outcome.failure) return std::nullopt;
    const bool cut = !turn.stopped;  // the turn reached the episode's length limit
    const std::int64_t room = limits_.max_tokens - static_cast<std::int64_t>(c.ids.size());
    const auto ask = [&](bool final, bool truncated) {
      const std::string name = fmt::format("prompt {} of {} (sample {}), turn {}", c.prompt,
                                           set.directory(), c.sample, c.turns);
      const json request = {{"record", records[p]},
                            {"messages", conversation},
                            {"turn", c.turns},
                            {"final", final},
                            {"truncated", truncated}};
      const core::Stopwatch watch;
      EnvironmentReply reply = environment_.step(request, final, name);
      outcome.environment_ms += watch.milliseconds();
      return reply;
    };
    try {
      core::fault_point("grpo.turn", limits_.fault_rank);
      EnvironmentReply reply = ask(cut || c.turns >= limits_.max_turns || room < 1, cut);
      if (reply.reward) {
        c.environment_reward = *reply.reward;
        c.truncated = cut;
        c.conversation = conversation.dump(-1, ' ', false, json::error_handler_t::replace);
        return std::nullopt;
      }
      json messages = json::array();
      for (const EnvironmentMessage& m : reply.messages)
        messages.push_back({{"role", m.role}, {"content", m.content}});
      std::vector<std::int32_t> tokens = formatter_.continuation(messages).tokens;
      if (static_cast<std::int64_t>(tokens.size()) + 1 > room) {
        // No room for the messages and a token of the next turn: the episode ends truncated,
        // without them (the policy never saw them), and its reward is asked for.
        c.truncated = true;
        c.environment_reward = *ask(true, true).reward;
        c.conversation = conversation.dump(-1, ' ', false, json::error_handler_t::replace);
        return std::nullopt;
      }
      for (const std::int32_t id : tokens) {
        c.ids.push_back(id);
        c.logprobs.push_back(0.0F);
        c.policy.push_back(0);
      }
      for (json& m : messages) {
        if (m["role"] == "ipython") ++c.tool_calls;
        conversation.push_back(std::move(m));
      }
      const std::int64_t max_new = room - static_cast<std::int64_t>(tokens.size());
      return model::GenerationEngine::Continuation{.tokens = std::move(tokens), .max_new = max_new};
    } catch (...) {
      outcome.failure = std::current_exception();
      return std::nullopt;
    }
  };
  engine.run_turns(source, turn_end, agree);
  return out;
}

}  // namespace l3::train::grpo
