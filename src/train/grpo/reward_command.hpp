// A verifier the user writes in any language (--reward-command "CMD ARGS"): started once per
// rank with /bin/sh -c, it reads one JSON request per line on its stdin and answers each with
// one line {"reward": x} on its stdout, in order. Its stderr is the job's. Each request carries
// an "id" (1, 2, ...); an answer that echoes it ({"reward": x, "id": N}) is checked against it.
// An answer written before its request was read, or a second answer to one request, is an
// error: taken as the next request's, it would shift every reward onto the wrong completion.
//
// Whatever goes wrong with it (it cannot start, exits or closes its output, takes longer than
// the timeout to read and answer a request, answers something that is not a JSON object with a
// finite number "reward") is a bad_input Error naming the command, the request's record and what
// happened; the process is killed when the object goes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace l3::train::grpo {

class RewardCommand {
 public:
  // `stop`: a stop request's flag (SIGTERM, SIGUSR1), looked at while waiting for the verifier:
  // once set, the exchange ends with a `stopped` Error (exit 75; the run continues from its last
  // checkpoint when requeued); null: none.
  RewardCommand(std::string command, double timeout_seconds,
                const std::atomic<bool>* stop = nullptr);
  ~RewardCommand();
  RewardCommand(const RewardCommand&) = delete;
  RewardCommand& operator=(const RewardCommand&) = delete;
  RewardCommand(RewardCommand&&) = delete;
  RewardCommand& operator=(RewardCommand&&) = delete;

  // Sends `request` (one line of JSON, no newline) and returns the reward of the answer.
  // `record`: how errors name the request ("prompt 12 of DIR").
  [[nodiscard]] double score(std::string_view request, const std::string& record);

  // The run's requests are all sent: ends its input and waits (at most --reward-timeout, at
  // most 10 s) for it to end. Anything it writes meanwhile answers no request: a verifier that
  // answered some request twice, which is an error (bad_input naming the command); then the
  // process group is ended as the destructor does.
  void finish();

  [[nodiscard]] const std::string& command() const noexcept { return command_; }

 private:
  [[noreturn]] void fail(const std::string& record, const std::string& what);
  // A stop request (SIGTERM, SIGUSR1) while it scores `record`: the verifier ended, a stopped
  // Error (exit 75) thrown. Returns when none is pending.
  void stop_if_asked(const std::string& record);
  // Appends what the verifier wrote, without waiting, to pending_.
  void receive(const std::string& record);
  void stop() noexcept;

  std::string command_;
  double timeout_;
  pid_t pid_ = -1;
  int socket_ = -1;  // our end of the socket pair that is the verifier's stdin and stdout
  const std::atomic<bool>* stop_;
  std::int64_t requests_ = 0;  // sent so far: the next request's id is one more
  std::string pending_;        // what it wrote and we have not taken as an answer yet
};

}  // namespace l3::train::grpo
