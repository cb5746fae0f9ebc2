#include "train/tensorboard/event_file.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/path_safety.hpp"
#include "train/tensorboard/event.pb.h"
#include "train/tensorboard/record_framing.hpp"

namespace l3::train::tensorboard {

namespace fs = std::filesystem;
using tensorboard_events::Event;
using tensorboard_events::Summary;

namespace {

constexpr std::string_view kPrefix = "events.out.tfevents.";

std::string suffix_of(Phase phase) {
  return fmt::format(".llama3-hpc-{}", core::phase_name(phase));
}

bool is_ours(const std::string& name, Phase phase) {
  return name.starts_with(kPrefix) && name.ends_with(suffix_of(phase)) &&
         !core::is_temporary_name(name);
}

// The <seconds> field of a name of ours (0 when it is not a number).
std::int64_t seconds_of(const std::string& name) {
  const std::string_view rest = std::string_view(name).substr(kPrefix.size());
  std::int64_t seconds = 0;
  std::from_chars(rest.data(), rest.data() + rest.size(), seconds);
  return seconds;
}

// A dot would split the name's fields: the short name, as TensorBoard's own writers use.
std::string short_host_name() {
  std::string name = core::host_name();
  name = name.substr(0, name.find('.'));
  return name.empty() ? "localhost" : name;
}

// One pass over `path`: calls `keep(raw_record)` for each record to keep, and says whether
// anything is dropped (a summary of a later step, a record cut short, a damaged one).
struct Scan {
  bool changed = false;
  bool damaged = false;
  bool any_summary = false;
  std::int64_t dropped = 0;
};

template <typename Keeper>
Scan scan(const std::string& path, std::int64_t step, Keeper&& keep) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::bad_input("cannot open for reading", {.file = path});
  RecordReader reader(in);
  Scan s;
  std::string data;
  for (;;) {
    const RecordReader::Result result = reader.next(data);
    if (result == RecordReader::Result::end) break;
    if (result != RecordReader::Result::record) {
      s.changed = true;
      s.damaged = result == RecordReader::Result::damaged;
      break;
    }
    Event event;
    // A record another writer added that this schema cannot parse is not ours to judge: kept.
    const bool parsed = event.ParseFromString(data);
    if (parsed && event.has_summary() && event.step() > step) {
      s.changed = true;
      ++s.dropped;
      continue;
    }
    if (parsed && event.has_summary()) s.any_summary = true;
    keep(data);
  }
  return s;
}

}  // namespace

std::string new_event_file_name(const std::string& directory, Phase phase, double now) {
  std::int64_t seconds = static_cast<std::int64_t>(std::floor(now));
  for (const std::string& path : event_files(directory, phase)) {
    seconds = std::max(seconds, seconds_of(fs::path(path).filename().string()) + 1);
  }
  return (fs::path(directory) / fmt::format("{}{}.{}.{}{}", kPrefix, seconds, short_host_name(),
                                            ::getpid(), suffix_of(phase)))
      .string();
}

std::vector<std::string> event_files(const std::string& directory, Phase phase) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_ours(name, phase) && entry.is_regular_file(ec) && !entry.is_symlink(ec)) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string event_file_run(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  RecordReader reader(in);
  std::string data;
  Event first;
  if (reader.next(data) != RecordReader::Result::record || !first.ParseFromString(data) ||
      !first.has_source_metadata() || first.source_metadata().writer() != "llama3-hpc")
    return "";
  return first.source_metadata().llama3_hpc_run();
}

TrimReport drop_steps_after(const std::string& directory, Phase phase, const std::string& run_id,
                            std::int64_t step) {
  TrimReport report;
  for (const std::string& path : event_files(directory, phase)) {
    if (run_id.empty() || event_file_run(path) != run_id) continue;  // not this run's
    const Scan first = scan(path, step, [](const std::string&) {});
    if (!first.changed) continue;
    report.events_dropped += first.dropped;
    if (first.damaged) report.damaged.push_back(path);
    if (!first.any_summary) {
      std::error_code ec;
      if (!fs::remove(path, ec) && ec) {
        throw core::internal_error(fmt::format("cannot remove: {}", ec.message()), {.file = path});
      }
      ++report.files_removed;
      continue;
    }
    core::AtomicFile rewritten(path);
    (void)scan(path, step, [&](const std::string& data) { rewritten.write(frame_record(data)); });
    rewritten.commit();
    ++report.files_rewritten;
  }
  return report;
}

}  // namespace l3::train::tensorboard
