// Errors as exceptions with context (file, tensor, record), mapped to exit codes at the CLI edge.
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace l3::core {

// Process exit codes: the contract with job scripts (jobs/*.sbatch requeue on kCheckpointed).
enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,      // a bug or an environment failure: the job should not be retried blindly
  kExitBadInput = 2,      // usage error or bad input: fix the command, the config or the data
  kExitCheckpointed = 75  // checkpointed and stopped before finishing (EX_TEMPFAIL): requeue
};

enum class ErrorKind {
  usage,      // the command line or a config file is wrong            -> exit 2
  bad_input,  // a data, model or checkpoint file is wrong/unreadable  -> exit 2
  internal,   // anything else: a failed system/MPI/CUDA call, a bug    -> exit 1
  stopped     // stopped on request before there was anything to save     -> exit 75
};

// Where the problem is. Every field is optional; what() puts the present ones in front of the
// message, e.g. "data/a.h5: tensor '/doc_offsets': record 12: offsets are not monotonic", or
// "data/train.jsonl:17: missing \"messages\"" for a line of a text file.
struct ErrorContext {
  std::string file;
  std::string tensor;
  std::string record;
  std::int64_t line = 0;  // 1-based line of `file`; 0 when not a line
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, ErrorContext context = {});

  [[nodiscard]] ErrorKind kind() const noexcept { return kind_; }
  [[nodiscard]] const ErrorContext& context() const noexcept { return context_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  [[nodiscard]] const char* what() const noexcept override { return text_.c_str(); }
  [[nodiscard]] int exit_code() const noexcept;

  // Fill in context that an outer layer knows and the thrower did not (fields already set win),
  // e.g. a tensor reader's error gets the file name from the checkpoint loader that called it.
  Error& add_context(const ErrorContext& outer);

 private:
  void render();

  ErrorKind kind_;
  std::string message_;
  ErrorContext context_;
  std::string text_;  // the one-line rendering returned by what()
};

// Thrown on the ranks that did not fail themselves when a collective check finds that another
// rank did: they stop with the failing rank's exit code and nothing to report (the failing
// rank reports), so rank 0 prints one meaningful line instead of N echoes.
class PeerFailure : public std::exception {
 public:
  explicit PeerFailure(int exit_code) noexcept : exit_code_(exit_code) {}
  [[nodiscard]] const char* what() const noexcept override { return "another rank failed"; }
  [[nodiscard]] int exit_code() const noexcept { return exit_code_; }

 private:
  int exit_code_;
};

[[nodiscard]] Error usage_error(std::string message);
[[nodiscard]] Error bad_input(std::string message, ErrorContext context = {});
[[nodiscard]] Error internal_error(std::string message, ErrorContext context = {});
// A run asked to stop (SIGTERM, SIGUSR1, the host) before its first step: nothing is lost, the
// job is requeued as after a checkpoint (exit 75).
[[nodiscard]] Error stopped_before_start(std::string message);

// The text of an errno value, safe on any thread (strerror is not).
[[nodiscard]] std::string errno_text(int error);

// The exit code and one-line description of any exception (Error, Boost.Program_options errors,
// bad_alloc, system_error, ...). Newlines are folded so that the text stays on one line.
struct ErrorSummary {
  int exit_code = kExitInternal;
  std::string text;
};
[[nodiscard]] ErrorSummary summarize(const std::exception_ptr& error) noexcept;

// Replaces newlines and other control characters by spaces and trims.
[[nodiscard]] std::string one_line(std::string_view text);

}  // namespace l3::core
