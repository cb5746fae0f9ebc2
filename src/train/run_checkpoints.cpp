#include "train/run_checkpoints.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>

#include "ckpt/checkpoint_reader.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/path_safety.hpp"
#include "core/timer.hpp"
#include "core/trace_range.hpp"
#include "core/words.hpp"
#include "dist/collectives.hpp"
#include "dist/node_map.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/tensor_state.hpp"
#include "train/progress_bar.hpp"
#include "train/train_config.hpp"

namespace l3::train {

namespace {

// This rank's master weights and AdamW moments over `ranges`, copied into `state` (a previous
// snapshot's buffers when it has them: their pages are mapped already).
ckpt::RankState snapshot(parallel::DataParallel& parallel, std::vector<model::FlatRange> ranges,
                         ckpt::RankState state) {
  state.allocate(std::move(ranges));
  parallel.optimizer().save_master(state.ranges, state.master);
  parallel.optimizer().save_moments(state.ranges, state.exp_avg, state.exp_avg_sq);
  return state;
}

// Loads `state` (this rank's state ranges) and the AdamW count into the optimizer, and the
// weights the model computes with; what the run continues from.
ResumedState load_state(parallel::DataParallel& parallel, const ckpt::RankState& state,
                        const ckpt::Manifest& manifest) {
  parallel.optimizer().load_master(state.ranges, state.master);
  parallel.optimizer().load_moments(state.ranges, state.exp_avg, state.exp_avg_sq);
  parallel.optimizer().set_adamw_steps(manifest.adamw_step);
  parallel.gather_parameters();
  const nlohmann::json last_eval =
      manifest.metrics.is_object() ? manifest.metrics.value("last_eval", nlohmann::json::object())
                                   : nlohmann::json::object();
  const auto eval_step = last_eval.find("step");
  return {.step = manifest.step,
          .position = {manifest.data_epoch, manifest.data_step},
          .skipped_steps = manifest.skipped_steps,
          .trained_tokens = manifest.trained_tokens,
          .trained_seconds = manifest.trained_seconds,
          .evaluated = eval_step != last_eval.end() && eval_step->is_number_integer() &&
                       eval_step->get<std::int64_t>() == manifest.step,
          .run_id = manifest.run_id};
}

}  // namespace

std::optional<LocalLevel> plan_local_level(const dist::World& world, const core::Logger& log,
                                           const TrainConfig& config, const std::string& run_key) {
  if (config.ckpt_local.empty()) return std::nullopt;
  const dist::NodeMap nodes = dist::NodeMap::of(world);
  LocalLevel level;
  level.node = nodes.name_of_rank(world.rank());
  level.directory = ckpt::local_level_directory(config.ckpt_local, level.node, config.ckpt_dir);
  level.every = config.checkpoint_every_local;
  level.flush_every = config.flush_every;
  level.run_key = run_key;
  level.plan = ckpt::plan_redundancy(config.ckpt_redundancy, nodes, config.xor_set_size);
  std::exception_ptr failure;
  try {
    core::refuse_link(level.directory, "--ckpt-local");
    core::check_writable_directory(level.directory, "--ckpt-local");
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
  if (!level.plan.downgraded.empty() && config.ckpt_redundancy != ckpt::Redundancy::none) {
    log.warn("--ckpt-redundancy {}: {}", ckpt::redundancy_name(config.ckpt_redundancy),
             level.plan.downgraded);
  }
  log.info("node-local checkpoints every {} in {} ({} node{}{}), {}; {}",
           level.every == 1 ? std::string("step") : core::count_of(level.every, "step"),
           config.ckpt_local, nodes.nodes(), nodes.nodes() == 1 ? "" : "s",
           nodes.pretended ? ", pretended by L3_PRETEND_NODES" : "", level.plan.describe(),
           level.flush_every > 0
               ? fmt::format(
                     "every {} also to {}",
                     level.flush_every == 1 ? std::string("one") : core::ordinal(level.flush_every),
                     config.ckpt_dir)
               : fmt::format("only the final one to {}", config.ckpt_dir));
  return level;
}

RunCheckpoints::RunCheckpoints(const dist::World& world, const core::Logger& log,
                               ProgressBar& progress, const std::string& ckpt_dir,
                               ckpt::WriterPolicy policy, const parallel::DataParallel& parallel,
                               std::optional<LocalLevel> local,
                               const parallel::TensorStateMap* tensor)
    : log_(log), progress_(progress), tensor_(tensor), local_(std::move(local)) {
  if (ckpt_dir.empty()) return;
  writer_ = std::make_unique<ckpt::CheckpointWriter>(world, ckpt_dir, policy);
  ckpt::RankState spare;
  // (tensor parallelism: the snapshot is converted into a state of the whole layout's pieces)
  if (tensor_ == nullptr) spare.allocate(parallel.write_ranges());
  writer_->provide_spare(std::move(spare));
  if (!local_) return;
  local_writer_ = std::make_unique<ckpt::LocalCheckpointWriter>(
      world, ckpt::LocalLevelConfig{.directory = local_->directory,
                                    .node = local_->node,
                                    .plan = local_->plan,
                                    .run_key = local_->run_key,
                                    .async = policy.async});
  ckpt::RankState local_spare;
  local_spare.allocate(parallel.optimizer().state_ranges());
  local_writer_->provide_spare(std::move(local_spare));
}

RunCheckpoints::~RunCheckpoints() = default;

void RunCheckpoints::start(const ckpt::RunFacts& run, parallel::DataParallel& parallel,
                           const model::ParameterLayout& layout) {
  if (!writer_) throw core::usage_error("no --ckpt-dir: nowhere to write a checkpoint");
  finish();  // the previous ones first (a flush of the node-local level writes here too)
  const core::Stopwatch watch;
  ckpt::Manifest manifest = ckpt::describe_checkpoint(run);
  // The host snapshot: this rank's pieces of the master weights and moments, in the previous
  // checkpoint's buffers when there was one.
  const core::TraceRange range("checkpoint snapshot");
  ckpt::RankState state = snapshot(parallel, parallel.write_ranges(), writer_->take_spare());
  if (tensor_ != nullptr) {
    // this rank's slice as pieces of the whole model's tensors: the checkpoint is layout-free
    state = tensor_->to_whole(state);
    writer_->write(tensor_->whole(), std::move(manifest), std::move(state));
  } else {
    writer_->write(layout, std::move(manifest), std::move(state));
  }
  snapshot_seconds_ = watch.seconds();
  pending_step_ = run.step;
  if (!writer_->busy()) finish();
}

void RunCheckpoints::start_local(const ckpt::RunFacts& run, parallel::DataParallel& parallel,
                                 const model::ParameterLayout& layout, bool allow_flush) {
  if (!local_writer_) return;
  finish();
  const core::Stopwatch watch;
  const bool flush = allow_flush && local_->flush_every > 0 &&
                     (run.step / local_->every) % local_->flush_every == 0;
  ckpt::Manifest manifest = ckpt::describe_checkpoint(run);
  const core::TraceRange range("node-local checkpoint snapshot");
  ckpt::RankState state =
      snapshot(parallel, parallel.optimizer().state_ranges(), local_writer_->take_spare());
  local_writer_->write(layout, std::move(manifest), std::move(state),
                       flush ? writer_.get() : nullptr, parallel.write_ranges());
  local_snapshot_seconds_ = watch.seconds();
  pending_local_step_ = run.step;
  if (flush) pending_step_ = run.step;
  if (!local_writer_->busy()) finish();
}

void RunCheckpoints::finish_if_ready() {
  if ((writer_ && writer_->ready()) || (local_writer_ && local_writer_->ready())) finish();
}

void RunCheckpoints::finish() {
  finish_local();
  finish_global();
}

void RunCheckpoints::finish_global() {
  if (!writer_ || !writer_->busy()) return;
  const std::optional<ckpt::WriteReport> report = writer_->wait();
  if (report) committed(*report, pending_step_, snapshot_seconds_);
}

void RunCheckpoints::finish_local() {
  if (!local_writer_ || !local_writer_->busy()) return;
  const std::optional<ckpt::LocalWriteReport> report = local_writer_->wait();
  if (!report) return;
  progress_.clear();
  if (report->failure.empty()) {
    log_.info(
        "node-local checkpoint of step {} complete: {:.1f} MB on the nodes in {:.2f} s (rank 0: "
        "{:.2f} s its state, {:.2f} s {}; training paused {:.3f} s for the snapshot)",
        report->step, static_cast<double>(report->bytes) / 1e6, report->seconds,
        report->state_seconds, report->redundancy_seconds,
        local_->plan.kind == ckpt::Redundancy::partner      ? "the partner copies"
        : local_->plan.kind == ckpt::Redundancy::xor_parity ? "the XOR parity"
                                                            : "no redundancy",
        local_snapshot_seconds_);
    const CheckpointReport local{.step = report->step,
                                 .directory = local_->directory,
                                 .bytes = report->bytes,
                                 .seconds = report->seconds};
    for (const auto& callback : local_callbacks_) callback(local);
  } else {
    log_.warn("node-local checkpoint of step {} failed, the run goes on: {}", report->step,
              report->failure);
  }
  if (report->flushed) committed(*report->flushed, report->step, 0);
}

void RunCheckpoints::committed(const ckpt::WriteReport& report, std::int64_t step, double paused) {
  progress_.clear();
  if (paused > 0) {
    log_.info(
        "checkpoint {} committed: {:.1f} MB in {:.2f} s (training paused {:.3f} s for the "
        "snapshot)",
        report.directory, static_cast<double>(report.bytes) / 1e6, report.seconds, paused);
  } else {
    log_.info(
        "checkpoint {} committed (flushed from the node-local snapshot): {:.1f} MB in {:.2f} s",
        report.directory, static_cast<double>(report.bytes) / 1e6, report.seconds);
  }
  longest_seconds_ = std::max(longest_seconds_, report.seconds);
  last_directory_ = report.directory;
  last_step_ = step;
  last_report_ = {.step = step,
                  .directory = report.directory,
                  .bytes = report.bytes,
                  .seconds = report.seconds};
  for (const auto& callback : callbacks_) callback(last_report_);
}

void RunCheckpoints::resumed_from_local(std::int64_t step) {
  if (local_writer_) local_writer_->resumed_at(step);
}

void RunCheckpoints::resumed_from(const std::string& step_dir, std::int64_t step) {
  last_directory_ = step_dir;
  last_step_ = step;
}

std::optional<ResumedState> restore_local_state(const dist::World& world, const core::Logger& log,
                                                const ckpt::LocalState& local,
                                                const std::string& origin,
                                                parallel::DataParallel& parallel) {
  const int fits = dist::all_reduce(
      world.comm(), local.state.ranges == parallel.optimizer().state_ranges() ? 1 : 0,
      dist::ReduceOp::min, "local ranges");
  if (fits == 0) return std::nullopt;
  const ckpt::Manifest& manifest = local.manifest;
  const ResumedState resumed = load_state(parallel, local.state, manifest);
  log.info(
      "resumed at step {} (data epoch {} step {}, {} AdamW updates) from the node-local level: {}",
      resumed.step, resumed.position.epoch, resumed.position.step, manifest.adamw_step, origin);
  return resumed;
}

ResumedState restore_checkpoint(const dist::World& world, const core::Logger& log,
                                const std::string& step_dir, const ckpt::Manifest& manifest,
                                parallel::DataParallel& parallel,
                                const model::ParameterLayout& layout,
                                const parallel::TensorStateMap* tensor) {
  const core::Stopwatch watch;
  std::exception_ptr failure;
  ckpt::RankState state;
  try {
    if (tensor != nullptr) {
      // this rank's slice, read as pieces of the whole model's tensors
      state = tensor->to_local(parallel.optimizer().state_ranges(),
                               [&](const std::vector<model::FlatRange>& whole) {
                                 return ckpt::read_rank_state(step_dir, tensor->whole(), whole);
                               });
    } else {
      state = ckpt::read_rank_state(step_dir, layout, parallel.optimizer().state_ranges());
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
  const ResumedState resumed = load_state(parallel, state, manifest);
  log.info(
      "resumed at step {} (data epoch {} step {}, {} AdamW updates) from {} written by {} "
      "rank{} in {:.2f} s",
      resumed.step, resumed.position.epoch, resumed.position.step, manifest.adamw_step, step_dir,
      manifest.world_size, manifest.world_size == 1 ? "" : "s", watch.seconds());
  return resumed;
}

}  // namespace l3::train
