// A program the user writes in any language, started once per rank with /bin/sh -c, that
// reads one JSON request per line on its stdin and answers each with one line of JSON on its
// stdout, in order: the verifier of --reward-command (reward_command.hpp) and the environment
// of --environment (environment.hpp). Its stderr is the job's. Each request carries an "id"
// (1, 2, ...); an answer that echoes it ({..., "id": N}) is checked against it. An answer
// written before its request was read, or a second answer to one request, is an error: taken
// as the next request's, it would shift every later answer onto the wrong request.
//
// Whatever goes wrong with it (it cannot start, exits or closes its output, takes longer than
// the timeout to read and answer a request, answers something that is not a JSON object) is a
// bad_input Error naming the option, the command, the request (record, turn) and what
// happened; the process and what it started are killed when the object goes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace l3::train::grpo {

// How errors name the process: its option ("--reward-command"), what it is ("verifier"), the
// timeout's option, what an answer must be (R"({"reward": NUMBER})"), what its answers are for
// ("completion"), and what it is doing while it answers ("scored").
struct CommandRole {
  std::string option;
  std::string noun;
  std::string timeout_option;
  std::string answer;
  std::string requester;
  std::string busy;
};

class CommandProcess {
 public:
  // `stop`: a stop request's flag (SIGTERM, SIGUSR1), looked at while waiting for the process:
  // once set, the exchange ends with a `stopped` Error (exit 75; the run continues from its last
  // checkpoint when requeued); null: none.
  CommandProcess(CommandRole role, std::string command, double timeout_seconds,
                 const std::atomic<bool>* stop = nullptr);
  ~CommandProcess();
  CommandProcess(const CommandProcess&) = delete;
  CommandProcess& operator=(const CommandProcess&) = delete;
  CommandProcess(CommandProcess&&) = delete;
  CommandProcess& operator=(CommandProcess&&) = delete;

  // Sends `request` (one line of JSON, an object, no newline; its "id" is added) and returns
  // the answer: a JSON object, its echoed id checked. `record`: how errors name the request
  // ("prompt 12 of DIR (sample 3)").
  [[nodiscard]] nlohmann::json exchange(std::string_view request, const std::string& record);

  // The run's requests are all sent: ends its input and waits (at most the timeout, at most
  // 10 s) for it to end. Anything it writes meanwhile answers no request: a process that
  // answered some request twice, which is an error (bad_input naming the command); then the
  // process group is ended as the destructor does.
  void finish();

  // A bad_input Error naming the command, `record` and `what` (with the process's exit status
  // if it has ended); the process is ended first. A pending stop request turns it into the
  // stopped Error (exit 75): whatever reached the process reached this rank too.
  [[noreturn]] void fail(const std::string& record, const std::string& what);

  [[nodiscard]] const std::string& command() const noexcept { return command_; }
  [[nodiscard]] const CommandRole& role() const noexcept { return role_; }

 private:
  // A stop request (SIGTERM, SIGUSR1) while it answers `record`: the process ended, a stopped
  // Error (exit 75) thrown. Returns when none is pending.
  void stop_if_asked(const std::string& record);
  // Appends what the process wrote, without waiting, to pending_.
  void receive(const std::string& record);
  void stop() noexcept;

  CommandRole role_;
  std::string command_;
  double timeout_;
  pid_t pid_ = -1;
  int socket_ = -1;  // our end of the socket pair that is the process's stdin and stdout
  const std::atomic<bool>* stop_;
  std::int64_t requests_ = 0;  // sent so far: the next request's id is one more
  std::string pending_;        // what it wrote and we have not taken as an answer yet
};

}  // namespace l3::train::grpo
