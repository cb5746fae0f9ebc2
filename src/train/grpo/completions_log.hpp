// --log-completions FILE: every completion of every step, one JSON line each ("step", "record",
// "prompt_index", "sample", "completion", "ids", "truncated", "reward", "advantage",
// "rewards/NAME"), appended by rank 0. It follows the output rule of core/output_file.hpp (a
// regular file with one name, or nothing yet) and, like --metrics, never loses what is not its
// own:
//
// - a fresh run appends after what is there (a previous run's lines are kept; a last line
//   without its newline gets one first, so that records never merge into it);
// - a file whose first line is not a completions record (a dataset's index.json named by
//   mistake, a user's notes) is refused, exit 2, and left as it is;
// - a resumed run drops only the lines the interrupted run wrote after its checkpoint: the
//   records of later steps at the end of the file (the interrupted run wrote last), and a last
//   line a crash cut short. Records of later steps that come before a record of an earlier step
//   belong to an earlier run and are kept. Dropping a suffix is one ftruncate: nothing else is
//   rewritten, and the file is read line by line with core/bounded_read.hpp's bound.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/output_file.hpp"

namespace l3::train::grpo {

// The step of a record the log writes, or nullopt for a line that is not one.
[[nodiscard]] std::optional<std::int64_t> completions_record_step(const nlohmann::json& record);

class CompletionsLog {
 public:
  // Opens (or creates) `path`; `resumed_at`: the step a resumed run continues from. bad_input
  // Error (exit 2) naming the file for what is not a completions log or not an output file.
  CompletionsLog(const std::string& path, std::optional<std::int64_t> resumed_at);

  // Appends lines (each ending in "\n").
  void append(std::string_view lines) { file_->append(lines); }
  [[nodiscard]] const std::string& path() const noexcept { return file_->path(); }
  // Lines the opening dropped (a resumed run's), for the log.
  [[nodiscard]] std::int64_t dropped() const noexcept { return dropped_; }

 private:
  std::unique_ptr<core::AppendedFile> file_;
  std::int64_t dropped_ = 0;
};

}  // namespace l3::train::grpo
