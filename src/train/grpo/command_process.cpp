#include "train/grpo/command_process.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/bounded_read.hpp"
#include "core/error.hpp"

extern char** environ;  // NOLINT: POSIX declares it for posix_spawn

namespace l3::train::grpo {

namespace {

// An answer longer than this is not one line of JSON: the process is writing something else.
constexpr std::size_t kMaxAnswerBytes = 1 << 20;
constexpr const char* kGone = "it exited or closed its output before answering";
// How often a wait for the process looks at the stop flag (SIGTERM, SIGUSR1).
constexpr long long kStopCheckMs = 100;
// How long finish() waits for the process to end once its input has: a well-behaved one ends
// at once; one that does not is killed after this (or the timeout, if shorter).
constexpr double kFinishGraceSeconds = 10.0;

std::string errno_text() { return std::strerror(errno); }

}  // namespace

CommandProcess::CommandProcess(CommandRole role, std::string command, double timeout_seconds,
                               const std::atomic<bool>* stop)
    : role_(std::move(role)), command_(std::move(command)), timeout_(timeout_seconds), stop_(stop) {
  // A socket pair rather than pipes: writing to a process that died fails with EPIPE through
  // send(MSG_NOSIGNAL), without a SIGPIPE (the library changes no signal disposition).
  int ends[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
    throw core::bad_input(
        fmt::format("{} \"{}\": cannot make its pipes: {}", role_.option, command_, errno_text()));
  }
  socket_ = ends[0];
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, ends[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, ends[1], STDOUT_FILENO);
  const std::string shell = "/bin/sh";
  std::string dash_c = "-c";
  // The job's stop signals (SIGTERM, SIGUSR1, SIGUSR2: Slurm sends them to every process of a
  // job step) are ignored by the process and what it starts (an ignored signal stays ignored
  // across exec; a blocked one would not: dash clears the mask): they ask this rank to
  // checkpoint, and a process they killed would fail the step it works for. The rank ends it
  // (stop(): end of input, then SIGKILL).
  std::string script = "trap '' TERM USR1 USR2; " + command_;
  std::vector<char*> argv = {const_cast<char*>(shell.c_str()), dash_c.data(), script.data(),
                             nullptr};
  // Its own process group: what the process starts (a shell's children, a pipeline) is killed
  // with it. Killing the shell alone left its children holding our stderr: a `sleep 30` behind a
  // timed-out process outlived the run by 30 s and kept whoever reads our output waiting.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  const int spawned =
      ::posix_spawn(&pid_, shell.c_str(), &actions, &attributes, argv.data(), environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  ::close(ends[1]);
  if (spawned != 0) {
    pid_ = -1;
    ::close(socket_);
    socket_ = -1;
    throw core::bad_input(fmt::format("{} \"{}\": cannot start /bin/sh: {}", role_.option, command_,
                                      std::strerror(spawned)));
  }
}

CommandProcess::~CommandProcess() { stop(); }

void CommandProcess::stop() noexcept {
  if (socket_ >= 0) {
    ::close(socket_);  // end of input: a well-behaved process exits
    socket_ = -1;
  }
  if (pid_ > 0) {
    // A short grace period, then it is killed: a run never waits on a stuck process. The shell
    // is waited for without being reaped (WNOWAIT): until it is reaped its pid, which names the
    // process group, cannot be reused, so the group's kill reaches only what the process
    // started, whether the shell ended by itself or not.
    siginfo_t info{};
    for (int i = 0; i < 50; ++i) {
      info.si_pid = 0;
      if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == pid_)
        break;
      ::usleep(2000);
    }
    ::kill(-pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
}

void CommandProcess::stop_if_asked(const std::string& record) {
  if (stop_ == nullptr || !stop_->load()) return;
  stop();
  throw core::Error(core::ErrorKind::stopped,
                    fmt::format("stopped by a signal while {} \"{}\" {} {}: "
                                "the run continues from its last checkpoint",
                                role_.option, command_, role_.busy, record));
}

void CommandProcess::fail(const std::string& record, const std::string& what) {
  // A stop asked for meanwhile: whatever reached the process reached this rank too.
  stop_if_asked(record);
  std::string status;
  if (pid_ > 0) {
    // Its exit status, if it has ended, without reaping it (stop() kills its group, then reaps).
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid_) {
      status = info.si_code == CLD_EXITED
                   ? fmt::format(" (it exited with status {})", info.si_status)
               : info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED
                   ? fmt::format(" (it was killed by signal {})", info.si_status)
                   : "";
    }
  }
  stop();
  throw core::bad_input(
      fmt::format("{} \"{}\", {}: {}{}", role_.option, command_, record, what, status));
}

nlohmann::json CommandProcess::exchange(std::string_view request, const std::string& record) {
  if (socket_ < 0)
    fail(record, fmt::format("the {} is not running (it failed before)", role_.noun));
  // Nothing may be waiting before the request goes: an answer there was written before this
  // request was read (or is a second answer to the previous one), and would be taken for this
  // request's, shifting every later answer onto the wrong request.
  if (pending_.empty()) {
    pollfd p{.fd = socket_, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0) receive(record);
  }
  if (!pending_.empty()) {
    fail(record, fmt::format("it wrote '{}' before reading this request: answer each request once, "
                             "after reading it",
                             pending_.substr(0, std::min<std::size_t>(pending_.find('\n'), 200))));
  }
  const std::int64_t id = ++requests_;
  std::string line(request);
  // The request's id, which an answer may echo ({..., "id": N}) to have it checked.
  if (line.ends_with('}')) {
    line.pop_back();
    line += fmt::format("{}\"id\": {}}}", line.ends_with('{') ? "" : ", ", id);
  }
  line += '\n';
  // One clock for the whole exchange, the request's writing included: a process that does not
  // read blocks a large request in the socket's buffer, and that wait is bounded too. The socket
  // is non-blocking and the wait sliced, so that a stop request (SIGTERM, SIGUSR1) ends it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
  std::size_t sent = 0;
  std::size_t newline = std::string::npos;
  while (sent < line.size() || newline == std::string::npos) {
    stop_if_asked(record);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      fail(record, sent < line.size()
                       ? fmt::format("it did not read the request within {} {} s",
                                     role_.timeout_option, timeout_)
                       : fmt::format("no answer within {} {} s", role_.timeout_option, timeout_));
    }
    pollfd p{.fd = socket_,
             .events = static_cast<short>(POLLIN | (sent < line.size() ? POLLOUT : 0)),
             .revents = 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, kStopCheckMs)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      fail(record, fmt::format("cannot wait for the {}: {}", role_.noun, errno_text()));
    }
    if (ready == 0) continue;
    if (sent < line.size() && (p.revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      const ssize_t n =
          ::send(socket_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
        if (errno == EPIPE || errno == ECONNRESET) fail(record, kGone);
        fail(record, fmt::format("cannot send the request: {}", errno_text()));
      }
      if (n > 0) sent += static_cast<std::size_t>(n);
    }
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      const std::size_t before = pending_.size();
      receive(record);
      newline = pending_.find('\n');
      if (newline != std::string::npos && newline >= before && sent < line.size()) {
        fail(record,
             "it answered before reading the whole request: answer each request once, "
             "after reading it");
      }
    }
  }
  const std::string answer = pending_.substr(0, newline);
  pending_.erase(0, newline + 1);
  nlohmann::json value;
  try {
    value = core::parse_json(answer, "", {});
  } catch (const core::Error&) {
    fail(record, fmt::format("the answer is not JSON: '{}'", answer.substr(0, 200)));
  }
  if (!value.is_object()) {
    fail(record, fmt::format("the answer is not {}: '{}'", role_.answer, answer.substr(0, 200)));
  }
  if (const auto echoed = value.find("id");
      echoed != value.end() &&
      (!echoed->is_number_integer() || echoed->get<std::int64_t>() != id)) {
    fail(record, fmt::format("the answer is to request {}, not to this one ({}): answers must "
                             "come in the order of the requests, one each",
                             echoed->dump(), id));
  }
  if (!pending_.empty()) {
    fail(record, "it wrote more than one answer to the request: answer each request once");
  }
  return value;
}

void CommandProcess::finish() {
  if (socket_ < 0) return;
  // End of input, then everything it writes until it ends: an answer now answers no request. It
  // is how a process that answers twice is caught whatever its timing: its second answer may
  // come after the next request went out, be taken for that one's and shift the rest; at the
  // end the answers outnumber the requests.
  ::shutdown(socket_, SHUT_WR);
  const std::string record = fmt::format("after the run's last request ({} sent)", requests_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(std::min(timeout_, kFinishGraceSeconds));
  for (;;) {
    if (const std::size_t start = pending_.find_first_not_of(" \t\r\n");
        start != std::string::npos) {
      const std::string extra = pending_.substr(start, 200);
      fail(record, fmt::format("it wrote '{}' beyond its answers: answer each request once (an "
                               "extra answer is taken for the next request's, and every later "
                               "answer goes to the wrong {})",
                               extra.substr(0, extra.find('\n')), role_.requester));
    }
    if (stop_ != nullptr && stop_->load()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) break;  // still running: stop() ends it
    pollfd p{.fd = socket_, .events = POLLIN, .revents = 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, kStopCheckMs)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buffer[4096];
    const ssize_t n = ::recv(socket_, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0) break;  // it closed its output: nothing more
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      break;
    }
    pending_.append(buffer, static_cast<std::size_t>(n));
  }
  stop();
}

void CommandProcess::receive(const std::string& record) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(socket_, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == ECONNRESET) fail(record, kGone);
      fail(record, fmt::format("cannot read the answer: {}", errno_text()));
    }
    if (n == 0) fail(record, kGone);
    pending_.append(buffer, static_cast<std::size_t>(n));
    if (pending_.size() > kMaxAnswerBytes) {
      fail(record,
           fmt::format("an answer longer than {} bytes without a newline", kMaxAnswerBytes));
    }
    if (static_cast<std::size_t>(n) < sizeof(buffer)) return;
  }
}

}  // namespace l3::train::grpo
