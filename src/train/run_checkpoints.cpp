#include "train/run_checkpoints.hpp"

#include <algorithm>
#include <exception>

#include "ckpt/checkpoint_reader.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "core/trace_range.hpp"
#include "dist/collectives.hpp"
#include "train/data_parallel.hpp"
#include "train/progress_bar.hpp"

namespace l3::train {

RunCheckpoints::RunCheckpoints(const dist::World& world, const core::Logger& log,
                               ProgressBar& progress, const std::string& ckpt_dir,
                               ckpt::WriterPolicy policy, const DataParallel& parallel)
    : log_(log), progress_(progress) {
  if (ckpt_dir.empty()) return;
  writer_ = std::make_unique<ckpt::CheckpointWriter>(world, ckpt_dir, policy);
  ckpt::RankState spare;
  spare.allocate(parallel.write_ranges());
  writer_->provide_spare(std::move(spare));
}

RunCheckpoints::~RunCheckpoints() = default;

void RunCheckpoints::start(const ckpt::RunFacts& run, DataParallel& parallel,
                           const model::ParameterLayout& layout) {
  if (!writer_) throw core::usage_error("no --ckpt-dir: nowhere to write a checkpoint");
  finish();  // the previous one first
  const core::Stopwatch watch;
  ckpt::Manifest manifest = ckpt::describe_checkpoint(run);
  // The host snapshot: this rank's pieces of the master weights and moments, in the previous
  // checkpoint's buffers when there was one.
  const core::TraceRange range("checkpoint snapshot");
  ckpt::RankState state = writer_->take_spare();
  const std::vector<model::FlatRange> mine = parallel.write_ranges();
  state.allocate(mine);
  parallel.optimizer().save_master(mine, state.master);
  parallel.optimizer().save_moments(mine, state.exp_avg, state.exp_avg_sq);
  writer_->write(layout, std::move(manifest), std::move(state));
  snapshot_seconds_ = watch.seconds();
  pending_step_ = run.step;
  if (!writer_->busy()) finish();
}

void RunCheckpoints::finish_if_ready() {
  if (writer_ && writer_->ready()) finish();
}

void RunCheckpoints::finish() {
  if (!writer_ || !writer_->busy()) return;
  const std::optional<ckpt::WriteReport> report = writer_->wait();
  if (!report) return;
  progress_.clear();
  log_.info(
      "checkpoint {} committed: {:.1f} MB in {:.2f} s (training paused {:.3f} s for the "
      "snapshot)",
      report->directory, static_cast<double>(report->bytes) / 1e6, report->seconds,
      snapshot_seconds_);
  longest_seconds_ = std::max(longest_seconds_, report->seconds);
  last_directory_ = report->directory;
  last_step_ = pending_step_;
  last_report_ = {.step = pending_step_,
                  .directory = report->directory,
                  .bytes = report->bytes,
                  .seconds = report->seconds};
  for (const auto& callback : callbacks_) callback(last_report_);
}

void RunCheckpoints::resumed_from(const std::string& step_dir, std::int64_t step) {
  last_directory_ = step_dir;
  last_step_ = step;
}

ResumedState restore_checkpoint(const dist::World& world, const core::Logger& log,
                                const std::string& step_dir, const ckpt::Manifest& manifest,
                                DataParallel& parallel, const model::ParameterLayout& layout) {
  const core::Stopwatch watch;
  std::exception_ptr failure;
  ckpt::RankState state;
  try {
    state = ckpt::read_rank_state(step_dir, layout, parallel.optimizer().state_ranges());
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
  parallel.optimizer().load_master(state.ranges, state.master);
  parallel.optimizer().load_moments(state.ranges, state.exp_avg, state.exp_avg_sq);
  parallel.optimizer().set_adamw_steps(manifest.adamw_step);
  parallel.gather_parameters();
  const ResumedState resumed{.step = manifest.step,
                             .position = {manifest.data_epoch, manifest.data_step},
                             .skipped_steps = manifest.skipped_steps,
                             .trained_tokens = manifest.trained_tokens,
                             .trained_seconds = manifest.trained_seconds};
  log.info(
      "resumed at step {} (data epoch {} step {}, {} AdamW updates) from {} written by {} "
      "rank{} in {:.2f} s",
      resumed.step, resumed.position.epoch, resumed.position.step, manifest.adamw_step, step_dir,
      manifest.world_size, manifest.world_size == 1 ? "" : "s", watch.seconds());
  return resumed;
}

}  // namespace l3::train
