#include "train/tensorboard/tensorboard_writer.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "core/deadline.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "train/tensorboard/event.pb.h"
#include "train/tensorboard/event_file.hpp"
#include "train/tensorboard/record_framing.hpp"

namespace l3::train::tensorboard {

namespace fs = std::filesystem;
using nlohmann::json;
using tensorboard_events::Event;
using tensorboard_events::Summary;

namespace {

void create_directory(const std::string& directory) {
  // A link to a directory is followed, as for --ckpt-dir; the files in it are created
  // exclusively (core::create_exclusive), never through a link.
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec || !fs::is_directory(directory, ec)) {
    throw core::bad_input(
        fmt::format("--tensorboard: cannot create the directory: {}",
                    ec ? ec.message() : std::string("a file of that name exists")),
        {.file = directory});
  }
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& directory, Phase phase,
                                     const std::string& run_id,
                                     std::optional<std::int64_t> resumed_at,
                                     const core::Logger& log) {
  create_directory(directory);
  if (resumed_at) {
    const TrimReport trim = drop_steps_after(directory, phase, run_id, *resumed_at);
    if (trim.events_dropped > 0) {
      log.info("tensorboard: dropped {} event(s) after step {} written by the interrupted run",
               trim.events_dropped, *resumed_at);
    }
    for (const std::string& damaged : trim.damaged) {
      log.warn("tensorboard: {} has a damaged record; kept the records before it", damaged);
    }
  } else if (!event_files(directory, phase).empty()) {
    log.warn(
        "tensorboard: {} already holds event files of an earlier {} run; TensorBoard draws them "
        "as one run with this one (give each run its own directory)",
        directory, core::phase_name(phase));
  }
  const double now = core::unix_now();
  path_ = new_event_file_name(directory, phase, now);
  const int fd = core::create_exclusive(path_);
  file_.reset(::fdopen(fd, "wb"));
  if (!file_) {
    ::close(fd);
    throw core::internal_error(fmt::format("cannot open: {}", core::errno_text(errno)),
                               {.file = path_});
  }
  Event first;
  first.set_wall_time(now);
  first.set_step(0);
  first.set_file_version("brain.Event:2");
  first.mutable_source_metadata()->set_writer("llama3-hpc");
  first.mutable_source_metadata()->set_llama3_hpc_run(run_id);
  append(first.SerializeAsString());
}

void TensorBoardWriter::write(const json& record) {
  const auto kind = record.find("kind");
  const auto step = record.find("step");
  if (kind == record.end() || step == record.end() || !step->is_number_integer()) return;
  if (*kind != "train" && *kind != "eval") return;
  const std::string prefix = kind->get<std::string>() + "/";
  Event event;
  event.set_wall_time(core::unix_now());
  event.set_step(step->get<std::int64_t>());
  Summary& summary = *event.mutable_summary();
  for (const auto& [name, value] : record.items()) {
    if (name == "kind" || name == "step") continue;
    float scalar = 0;
    if (value.is_number()) {
      scalar = value.get<float>();
    } else if (value.is_boolean()) {
      scalar = value.get<bool>() ? 1.0F : 0.0F;
    } else {
      continue;  // null: a skipped step's loss, an MFU the CPU has none of
    }
    Summary::Value& v = *summary.add_value();
    v.set_tag(prefix + name);
    v.set_simple_value(scalar);
  }
  append(event.SerializeAsString());
}

void TensorBoardWriter::append(const std::string& event) {
  const std::string record = frame_record(event);
  if (std::fwrite(record.data(), 1, record.size(), file_.get()) != record.size() ||
      std::fflush(file_.get()) != 0) {
    throw core::internal_error(fmt::format("cannot write: {}", core::errno_text(errno)),
                               {.file = path_});
  }
}

void TensorBoardWriter::sync() {
  if (std::fflush(file_.get()) != 0 || ::fsync(::fileno(file_.get())) != 0) {
    throw core::internal_error(fmt::format("cannot sync: {}", core::errno_text(errno)),
                               {.file = path_});
  }
}

}  // namespace l3::train::tensorboard
