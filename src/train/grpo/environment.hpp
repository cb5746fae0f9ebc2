// The environment of multi-turn episodes (--environment "CMD ARGS"): a program in any language,
// started once per rank (command_process.hpp: the line protocol, its failures, its signals and
// how it ends). After each policy turn of an episode it reads one JSON line,
//   {"record": {...}, "messages": [{"role": ..., "content": ...}, ...], "turn": K,
//    "final": BOOL, "truncated": BOOL, "id": N}
// (messages: the conversation so far, the prompt's messages first and the policy's turns as
// "assistant"; turn: the policy turns so far), and answers with one line, either
//   {"messages": [{"role": "ipython" | "user" | "system", "content": "..."}, ...]}
// to have them appended (prefilled after the policy's turn in the chat template, then the
// assistant's header) and the policy take its next turn, or
//   {"reward": R}
// to end the episode with that reward. With "final": true (the policy's turn reached the length
// limit, --max-turns was reached, or the environment's last messages would not fit) the answer
// must be a reward. Anything else (both, neither, a message that is not {"role", "content"} with
// one of those roles, "assistant" messages, a reward that is not a finite number) is a bad_input
// Error naming the command, the episode (its record and sample) and the turn.
#pragma once

#include <atomic>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "train/grpo/command_process.hpp"

namespace l3::train::grpo {

struct EnvironmentMessage {
  std::string role;
  std::string content;
};

// The environment's answer: the episode's reward (it ended) or messages to append.
struct EnvironmentReply {
  std::optional<double> reward;
  std::vector<EnvironmentMessage> messages;
};

class Environment {
 public:
  // `timeout_seconds`: --reward-timeout, for each answer; `stop`: as CommandProcess has it.
  Environment(std::string command, double timeout_seconds, const std::atomic<bool>* stop = nullptr);

  // One exchange: `request` holds the record, the messages, the turn and the flags (its "id" is
  // added). `final`: only a reward is a valid answer. `episode`: how errors name it ("prompt 3 of
  // DIR (sample 1), turn 2").
  [[nodiscard]] EnvironmentReply step(const nlohmann::json& request, bool final,
                                      const std::string& episode);

  // The run's episodes are all done (CommandProcess::finish).
  void finish() { process_.finish(); }

  [[nodiscard]] const std::string& command() const noexcept { return process_.command(); }

 private:
  CommandProcess process_;
};

}  // namespace l3::train::grpo
