// The event files a training phase writes into a TensorBoard directory (--tensorboard): their
// names, and the trim that lets a resumed run write no step twice.
//
// Files are named "events.out.tfevents.<seconds>.<host>.<pid>.llama3-hpc-<phase>". TensorBoard
// reads a directory's event files in the order of their names and draws the steps of all of
// them as one run; the suffix marks the files of ours and their phase, so that a trim never
// touches another program's files or another phase's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/phase.hpp"

namespace l3::train::tensorboard {

// A new file's name in `directory` for a run of `phase` started at `now` (seconds since the
// epoch). Its <seconds> is at least one more than every earlier file of ours there, so that it
// sorts after the files it continues even when both start within the same second.
[[nodiscard]] std::string new_event_file_name(const std::string& directory, Phase phase,
                                              double now);

// The event files of ours of `phase` in `directory` (regular files, no links), in name order.
[[nodiscard]] std::vector<std::string> event_files(const std::string& directory, Phase phase);

struct TrimReport {
  int files_rewritten = 0;
  int files_removed = 0;  // nothing left in them but the file's first record
  std::int64_t events_dropped = 0;
  std::vector<std::string> damaged;  // files with a damaged record: cut there (a warning)
};

// The run that wrote the event file at `path`, from its first event (its source metadata's
// llama3_hpc_run), or "" when the file does not begin with a whole event of ours (another
// program's file, one cut in its first record, an earlier version's).
[[nodiscard]] std::string event_file_run(const std::string& path);

// Drops, from every event file of `phase` in `directory` that run `run_id` wrote (named as ours
// and identified by its first event: event_file_run), the summaries of steps after `step`
// (written by an interrupted run after the checkpoint its successor resumes from), and a last
// record cut short. Other runs' files, and files that cannot be identified, are never
// rewritten, removed or counted. Records are kept byte for byte; a file is rewritten under a
// temporary name and renamed only when something is dropped, else left untouched.
TrimReport drop_steps_after(const std::string& directory, Phase phase, const std::string& run_id,
                            std::int64_t step);

}  // namespace l3::train::tensorboard
