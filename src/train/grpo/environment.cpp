#include "train/grpo/environment.hpp"

#include <fmt/format.h>

#include <cmath>

namespace l3::train::grpo {

using nlohmann::json;

namespace {

constexpr const char* kAnswers =
    R"({"messages": [{"role": "ipython" or "user" or "system", "content": STRING}, ...]} or )"
    R"({"reward": NUMBER})";

std::string shown(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 200);
}

}  // namespace

Environment::Environment(std::string command, double timeout_seconds, const std::atomic<bool>* stop)
    : process_(CommandRole{.option = "--environment",
                           .noun = "environment",
                           .timeout_option = "--reward-timeout",
                           .answer = kAnswers,
                           .requester = "episode",
                           .busy = "answered"},
               std::move(command), timeout_seconds, stop) {}

EnvironmentReply Environment::step(const json& request, bool final, const std::string& episode) {
  const json answer =
      process_.exchange(request.dump(-1, ' ', false, json::error_handler_t::replace), episode);
  const auto reward = answer.find("reward");
  const auto messages = answer.find("messages");
  if ((reward == answer.end()) == (messages == answer.end())) {
    process_.fail(episode, fmt::format("the answer must be {}, {}: '{}'", kAnswers,
                                       reward == answer.end() ? "neither is there" : "not both",
                                       shown(answer)));
  }
  EnvironmentReply reply;
  if (reward != answer.end()) {
    if (!reward->is_number()) {
      process_.fail(episode,
                    fmt::format(R"(the answer's "reward" is not a number: '{}')", shown(answer)));
    }
    const double x = reward->get<double>();
    if (!std::isfinite(x)) process_.fail(episode, fmt::format("the reward {} is not finite", x));
    reply.reward = x;
    return reply;
  }
  if (final) {
    process_.fail(episode, fmt::format(R"(the episode had no turn left ("final": true): the )"
                                       R"(answer must be {{"reward": NUMBER}}, not messages: '{}')",
                                       shown(answer)));
  }
  if (!messages->is_array() || messages->empty()) {
    process_.fail(episode,
                  fmt::format(R"("messages" must be a non-empty list: '{}')", shown(answer)));
  }
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const auto role = m.is_object() ? m.find("role") : m.end();
    const auto content = m.is_object() ? m.find("content") : m.end();
    if (!m.is_object() || role == m.end() || !role->is_string() || content == m.end() ||
        !content->is_string()) {
      process_.fail(episode, fmt::format(R"(messages[{}] is not {{"role": STRING, "content": )"
                                         R"(STRING}}: '{}')",
                                         i, shown(m)));
    }
    const std::string name = role->get<std::string>();
    if (name != "ipython" && name != "user" && name != "system") {
      process_.fail(episode,
                    fmt::format(R"(messages[{}] has the role "{}": an environment speaks as )"
                                R"("ipython" (a tool's result), "user" or "system"{})",
                                i, name,
                                name == "assistant" ? " (the policy is the assistant)"
                                : name == "tool"    ? R"( (Llama 3.1 names tool results "ipython"))"
                                                    : ""));
    }
    reply.messages.push_back({name, content->get<std::string>()});
  }
  return reply;
}

}  // namespace l3::train::grpo
