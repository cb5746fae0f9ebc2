// A verifier the user writes in any language (--reward-command "CMD ARGS"): started once per
// rank (command_process.hpp: its protocol, its failures and how it ends), it answers each
// request, one JSON line {"prompt", "completion", "record"}, with one line {"reward": x}.
// An answer without a finite number "reward" is a bad_input Error naming the command and the
// request's record.
#pragma once

#include <atomic>
#include <string>
#include <string_view>

#include "train/grpo/command_process.hpp"

namespace l3::train::grpo {

class RewardCommand {
 public:
  // `stop`: as CommandProcess has it (a stop request ends a wait with exit 75).
  RewardCommand(std::string command, double timeout_seconds,
                const std::atomic<bool>* stop = nullptr);

  // Sends `request` (one line of JSON, no newline) and returns the reward of the answer.
  // `record`: how errors name the request ("prompt 12 of DIR").
  [[nodiscard]] double score(std::string_view request, const std::string& record);

  // The run's requests are all sent (CommandProcess::finish).
  void finish() { process_.finish(); }

  [[nodiscard]] const std::string& command() const noexcept { return process_.command(); }

 private:
  CommandProcess process_;
};

}  // namespace l3::train::grpo
