#include "train/grpo/reward_command.hpp"

#include <fmt/format.h>

#include <cmath>

namespace l3::train::grpo {

RewardCommand::RewardCommand(std::string command, double timeout_seconds,
                             const std::atomic<bool>* stop)
    : process_(CommandRole{.option = "--reward-command",
                           .noun = "verifier",
                           .timeout_option = "--reward-timeout",
                           .answer = R"({"reward": NUMBER})",
                           .requester = "completion",
                           .busy = "scored"},
               std::move(command), timeout_seconds, stop) {}

double RewardCommand::score(std::string_view request, const std::string& record) {
  const nlohmann::json answer = process_.exchange(request, record);
  const auto reward = answer.find("reward");
  if (reward == answer.end() || !reward->is_number()) {
    process_.fail(record, fmt::format(R"(the answer is not {{"reward": NUMBER}}: '{}')",
                                      answer.dump().substr(0, 200)));
  }
  const double x = reward->get<double>();
  if (!std::isfinite(x)) process_.fail(record, fmt::format("the reward {} is not finite", x));
  return x;
}

}  // namespace l3::train::grpo
