// A verifier the user writes in any language (--reward-command "CMD ARGS"): started once per
// rank with /bin/sh -c, it reads one JSON request per line on its stdin and answers each with
// one line {"reward": x} on its stdout, in order. Its stderr is the job's.
//
// Whatever goes wrong with it (it cannot start, exits or closes its output, takes longer than
// the timeout to answer a request, answers something that is not a JSON object with a finite
// number "reward") is a bad_input Error naming the command, the request's record and what
// happened; the process is killed when the object goes.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace l3::train::grpo {

class RewardCommand {
 public:
  RewardCommand(std::string command, double timeout_seconds);
  ~RewardCommand();
  RewardCommand(const RewardCommand&) = delete;
  RewardCommand& operator=(const RewardCommand&) = delete;
  RewardCommand(RewardCommand&&) = delete;
  RewardCommand& operator=(RewardCommand&&) = delete;

  // Sends `request` (one line of JSON, no newline) and returns the reward of the answer.
  // `record`: how errors name the request ("prompt 12 of DIR").
  [[nodiscard]] double score(std::string_view request, const std::string& record);

  [[nodiscard]] const std::string& command() const noexcept { return command_; }

 private:
  [[noreturn]] void fail(const std::string& record, const std::string& what);
  void stop() noexcept;

  std::string command_;
  double timeout_;
  pid_t pid_ = -1;
  int socket_ = -1;      // our end of the socket pair that is the verifier's stdin and stdout
  std::string pending_;  // what it wrote after its last complete line
};

}  // namespace l3::train::grpo
