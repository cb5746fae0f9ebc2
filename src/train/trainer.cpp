#include "train/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/timer.hpp"
#include "core/trace_range.hpp"
#include "dist/collectives.hpp"
#include "kernels/backend_options.hpp"
#include "model/llama_model.hpp"
#include "train/evaluator.hpp"
#include "train/run_report.hpp"
#include "train/stop_policy.hpp"
#include "train/trainer_parts.hpp"

namespace l3::train {

struct Trainer::Impl {
  Impl(const dist::World& w, const core::Logger& l, TrainConfig c, std::unique_ptr<StepSource> d,
       const std::atomic<bool>* stop_flag, const grpo::GenerationLink* link)
      : world(w),
        log(l),
        parts(assemble_trainer(w, l, std::move(c), std::move(d), stop_flag, link)),
        data_world(parts->data_world(w)),
        config(parts->config),
        ops(*parts->ops),
        model(*parts->model),
        objective(*parts->objective),
        parallel(*parts->parallel),
        checkpoints(*parts->checkpoints),
        progress(*parts->progress),
        stop(w, l,
             {.deadline_unix = config.deadline_unix,
              .deadline_margin = config.deadline_margin,
              .max_bad_steps = config.max_bad_steps,
              .seq_len = config.seq_len}),
        total(parts->total_steps),
        reporter(l, progress, sinks(*parts), config.log_every, total) {
    if (const std::optional<ResumedState>& r = parts->resumed) {
      done = first_step = r->step;
      position = r->position;
      skipped = r->skipped_steps;
      prior_tokens = r->trained_tokens;
      prior_seconds = r->trained_seconds;
    }
    stop.set_external_stop(stop_flag);
    checkpoints.on_commit(
        [this](const CheckpointReport& r) { reporter.checkpoint_committed(r, "global"); });
    checkpoints.on_local_commit(
        [this](const CheckpointReport& r) { reporter.checkpoint_committed(r, "node-local"); });
    report_start();
    if (parts->reprotect_local) local_checkpoint(false);
  }

  static std::vector<MetricsSink*> sinks(const TrainerParts& p) {
    std::vector<MetricsSink*> all;
    if (p.metrics) all.push_back(p.metrics.get());
    if (p.tensorboard) all.push_back(p.tensorboard.get());
    return all;
  }

  // The "run" record: what the metrics' reader (`llama3-hpc report`) says about this run.
  void report_start() {
    const model::ModelConfig& mc = model.whole_config();
    const model::ParameterLayout whole(mc, model.layout().head());  // a tensor slice's whole
    // The model as the options name it (a resumed run's own config is named by its checkpoint).
    const std::string& named = !config.init.empty() ? config.init : config.model;
    // The model's own tensors for its head: a reward model has the score head (H values), not
    // the (V, H) lm_head; LoRA's adapters are counted in trainable_parameters only.
    nlohmann::json record = {
        {"phase", phase_name(config.phase)},
        {"step", first_step},
        {"total_steps", total},
        {"ranks", world.size()},
        {"backend", kernels::backend_name(ops.backend())},
        {"model", named.empty() ? mc.name : named},
        {"parameters", whole.parameter_count()},
        {"trainable_parameters", model.has_adapters() ? model.trainable_layout().parameter_count()
                                                      : whole.parameter_count()},
        {"resumed", parts->resumed.has_value()},
        {"resumed_from",
         parts->resumed ? nlohmann::json(parts->resumed_from) : nlohmann::json(nullptr)}};
    // GRPO's settings: the report tells from them what cannot move in this run (--beta,
    // --num-iterations).
    if (config.phase == Phase::grpo) config.grpo.add_to(record["grpo"]);
    reporter.run_started(std::move(record));
  }

  // One optimizer step: the data, forward and backward over the micro-batches (the gradient
  // reduction overlapping the backward), the gradient norm, the update, the metrics.
  StepMetrics run_step() {
    const core::Stopwatch watch;
    const core::TraceRange step_range("step {}", done + 1);
    // A source failing on some ranks only (a host's DataSource, a read error) must not leave
    // the others waiting in the step's collectives: the ranks agree first.
    const data::StepData* next = nullptr;
    std::exception_ptr failure;
    try {
      const core::TraceRange range("data");
      next = &parts->data->next();
    } catch (...) {
      failure = std::current_exception();
    }
    dist::agree_on_failure(world, failure);
    const data::StepData& data = *next;
    const double wait_ms = parts->data->last_wait_ms();
    (void)ops.take_input_wait_ms();  // waits before this step (evaluation) are not its own

    // The global denominators first: each rank's gradients are then already those of the
    // global mean.
    // The objective's units (tokens, pairs), document tokens, tokens in the loss.
    std::array<std::int64_t, 3> counts{0, 0, 0};
    for (const model::Batch& b : data.micro) {
      counts[0] += objective.units(b);
      counts[1] += b.document_tokens;
      counts[2] += b.counted_tokens();
    }
    dist::all_reduce(data_world.comm(), std::span<std::int64_t>(counts), dist::ReduceOp::sum,
                     "step counts");
    const float scale = counts[0] > 0 ? 1.0F / static_cast<float>(counts[0]) : 0.0F;

    model.zero_gradients();
    objective.begin_step();
    parallel.begin_step(model.gradients());
    const bool zero2 = parallel.shards_gradients();
    for (std::size_t m = 0; m < data.micro.size(); ++m) {
      // ZeRO-1 reduces during the last micro-batch's backward; ZeRO-2 during every one.
      const bool last = m + 1 == data.micro.size();
      const core::TraceRange range("micro-batch {}", m);
      parallel.begin_micro_batch();  // ZeRO-2's groups (nothing without)
      // LoRA's dropout masks: a function of the seed, the step, the rank and the micro-batch,
      // so that a rerun or a restart draws the same ones.
      model.set_dropout_draw({.seed = config.seed,
                              .step = static_cast<std::uint64_t>(done),
                              .rank = static_cast<std::uint64_t>(world.rank()),
                              .micro_batch = static_cast<std::uint64_t>(m)});
      if (last && !zero2) {
        model.set_gradient_ready_hook(
            [this](std::int64_t offset) { parallel.gradients_ready(offset); });
      }
      // A micro-batch with nothing for the objective runs with no rows: the same window and
      // gradient-ready calls as the other ranks' (ZeRO-3 gathers need every rank).
      objective.train(data.micro[m], scale);
      if (last && !zero2) model.set_gradient_ready_hook({});
      parallel.end_micro_batch();
    }
    {
      const core::TraceRange range("gradient reduction wait");
      parallel.finish_reduction();
    }
    double norm = 0;
    {
      // Queued right behind the backward: its one download is the step's wait for the GPU.
      const core::TraceRange range("gradient norm");
      norm = parallel.gradient_norm();
    }
    // The step's one read of its losses (the micro-batches added them up in backend memory);
    // the queue is empty by now, so it costs a small copy, not a second wait.
    std::array<double, LossSums::kValues> sums = objective.step_sums().values();
    dist::all_reduce(data_world.comm(), std::span<double>(sums).first(LossSums::kSums),
                     dist::ReduceOp::sum, "step loss");
    dist::all_reduce(data_world.comm(), std::span<double>(sums).last(LossSums::kMaxima),
                     dist::ReduceOp::max, "step maxima");

    StepMetrics m;
    m.step = done + 1;
    m.total_steps = total;
    m.epoch = data.position.epoch;
    m.lr = parts->schedule.at(done);
    m.grad_norm = norm;
    m.tokens = counts[1];
    m.loss_tokens = counts[2];
    m.extra = data.metrics;  // what the source says about the step (online RL's rollout)
    objective.describe_step(LossSums::of(sums), counts[0], m);
    m.skipped = !std::isfinite(m.loss) || !std::isfinite(norm);
    core::fault_point("train.update", world.rank());  // gradients reduced, weights not updated
    if (!m.skipped) {
      const core::TraceRange range("optimizer update and weight all-gather");
      parallel.update(static_cast<float>(m.lr),
                      static_cast<float>(clip_factor(norm, config.grad_clip)));
    } else {
      ++skipped;
    }
    stop.count(m);
    ops.synchronize();
    position = data.next;
    ++done;

    m.step_ms = watch.milliseconds();
    // The host's wait for the prefetcher (the GPU's queue is empty then) plus the time the
    // backend's compute queue stood waiting for input copies during the step.
    m.data_wait_ms = wait_ms + ops.take_input_wait_ms();
    const parallel::ReductionTimes& t = parallel.times();
    m.reduce_wait_ms = 1e3 * t.wait_seconds;
    m.reduce_ms = 1e3 * t.reduce_seconds;
    m.gather_ms = 1e3 * t.gather_seconds;
    m.gather_wait_ms = 1e3 * t.gather_wait_seconds;
    m.gathers = t.gathers;
    m.gathers_prefetched = t.gathers_prefetched;
    if (parts->frozen) {  // LoRA: the frozen model's gathers
      const parallel::GatherTimes g = parts->frozen->take_gather_times();
      m.gather_ms += 1e3 * g.gather_seconds;
      m.gather_wait_ms += 1e3 * g.wait_seconds;
      m.gathers += g.gathers;
      m.gathers_prefetched += g.prefetched;
    }
    // A source's times (time/NAME_ms) as shares of the step too, and the rest: training's.
    double source_ms = 0.0;
    for (std::size_t i = 0, n = m.extra.size(); i < n; ++i) {
      const std::string name = m.extra[i].first;
      if (!name.starts_with("time/") || !name.ends_with("_ms")) continue;
      source_ms += m.extra[i].second;
      m.extra.emplace_back(name.substr(0, name.size() - 3) + "_share",
                           m.extra[i].second / std::max(1e-9, m.step_ms));
    }
    if (source_ms > 0) {
      m.extra.emplace_back("time/train_share",
                           std::max(0.0, m.step_ms - source_ms) / std::max(1e-9, m.step_ms));
    }
    m.tokens_per_s = static_cast<double>(m.tokens) / std::max(1e-9, m.step_ms / 1e3);
    if (parts->peak_tflops > 0) {
      m.mfu = m.tokens_per_s *
              model.whole_config().training_flops_per_token(
                  config.seq_len, model.layout().head() == model::HeadKind::language_model) /
              (parts->peak_tflops * 1e12 * world.size());
    }
    run_seconds += m.step_ms / 1e3;
    run_tokens += m.tokens;
    m.eta_seconds =
        run_seconds / static_cast<double>(done - first_step) * static_cast<double>(total - done);
    return m;
  }

  std::optional<EvalMetrics> evaluate() {
    if (config.val_data.empty()) return std::nullopt;
    // Online RL evaluates by generating: its source does.
    std::optional<EvalMetrics> own = parts->data->evaluate();
    EvalMetrics m;
    if (own) {
      m = std::move(*own);
    } else {
      EvalConfig eval = validation_config(config);
      eval.reference = parts->val_reference.empty() ? nullptr : &parts->val_reference;
      m = train::evaluate(data_world, model, parts->val_index, eval);
    }
    m.step = done;
    reporter.eval(m);
    last_eval = m;
    return m;
  }

  // Starts a checkpoint of the state after `done` steps (in the background unless
  // --checkpoint-sync), unless one of this step exists.
  void checkpoint() {
    if (checkpoints.has(done)) return;
    parts->data->before_checkpoint(done);
    reporter.sync();  // the steps it holds are on disk in the metrics before it commits
    checkpoints.start(facts(), parallel, model.trainable_layout());
  }

  // Starts a node-local checkpoint of the state after `done` steps (flushed to --ckpt-dir when
  // it is the flush_every-th, unless `allow_flush` is false).
  void local_checkpoint(bool allow_flush = true) {
    parts->data->before_checkpoint(done);
    reporter.sync();
    checkpoints.start_local(facts(), parallel, model.trainable_layout(), allow_flush);
  }

  // What a checkpoint of the state after `done` steps records.
  ckpt::RunFacts facts() const {
    nlohmann::json metrics = nlohmann::json::object();
    if (last_step) metrics["last_step"] = to_json(*last_step);
    if (last_eval) metrics["last_eval"] = to_json(*last_eval);
    const LrSchedule& s = parts->schedule;
    return ckpt::RunFacts{.step = done,
                          .phase = config.phase,
                          .head = model.layout().head(),
                          .model = model.whole_config(),
                          .world_size = world.size(),
                          .data_epoch = position.epoch,
                          .data_step = position.step,
                          .finished = done >= total,
                          .tokenizer_sha256 = parts->index.tokenizer_sha256,
                          .tokenizer = parts->index.tokenizer_name,
                          .config = config.to_json(),
                          .adamw_step = parallel.optimizer().adamw_steps(),
                          .skipped_steps = skipped,
                          .trained_tokens = prior_tokens + run_tokens,
                          .trained_seconds = prior_seconds + run_seconds,
                          .schedule = {.lr = s.lr,
                                       .min_lr = s.min_lr,
                                       .warmup = s.warmup,
                                       .total_steps = s.total,
                                       .next_lr = s.at(done)},
                          .seed = config.seed,
                          .metrics = std::move(metrics),
                          .lora = model.has_adapters() ? std::optional(config.lora) : std::nullopt,
                          .base = parts->lora_base,
                          .base_xxh64 = parts->lora_base_xxh64,
                          .reference = parts->reference_record,
                          .run_key = parts->run_key,
                          .run_id = parts->run_id};
  }

  // The step boundary's decision, agreed by every rank: false when the run stops here.
  bool continue_at_boundary() {
    const BoundaryDecision agreed = stop.agree({.steps_this_run = done - first_step,
                                                .run_seconds = run_seconds,
                                                .checkpoint_seconds = checkpoints.longest_seconds(),
                                                .can_checkpoint = checkpoints.enabled()});
    if (agreed.stop) {
      progress.clear();
      // Before the first step of this run the state is the one it started from (the checkpoint
      // it resumed, or the initial weights the options give again): nothing new to save.
      const bool nothing_new = done == first_step;
      log.warn("stopping at step {} of {} on request: {}", done, total,
               nothing_new             ? "no step run yet, nothing new to save"
               : checkpoints.enabled() ? "writing a checkpoint"
                                       : "no --ckpt-dir, nothing to save");
      stopped = true;
      if (checkpoints.enabled() && !nothing_new) checkpoint();
      checkpoints.finish();
      return false;
    }
    if (agreed.checkpoint) {
      if (checkpoints.enabled()) {
        checkpoint();
      } else {
        log.warn("a checkpoint was requested at step {}, but there is no --ckpt-dir to write it to",
                 done);
      }
    }
    return true;
  }

  const dist::World& world;
  const core::Logger& log;
  std::unique_ptr<TrainerParts> parts;
  // The ranks of this rank's tensor rank (world itself without --tensor-parallel): a tensor
  // group's ranks run the same data, so a step's counts and sums add up over these.
  const dist::World& data_world;
  const TrainConfig& config;
  kernels::Ops& ops;
  model::LlamaModel& model;
  Objective& objective;  // what the model is trained for (train/objectives/)
  parallel::DataParallel& parallel;
  RunCheckpoints& checkpoints;
  ProgressBar& progress;
  StopPolicy stop;
  const std::int64_t total;
  RunReport reporter;

  // Where the run is.
  std::int64_t done = 0;
  std::int64_t first_step = 0;  // steps done before this run started (resumed)
  data::Position position{0, 0};
  std::int64_t skipped = 0;
  double run_seconds = 0;
  std::int64_t run_tokens = 0;
  std::int64_t prior_tokens = 0;  // trained before this run (resumed)
  double prior_seconds = 0;
  std::optional<StepMetrics> last_step;
  std::optional<EvalMetrics> last_eval;
  bool stopped = false;
};

Trainer::Trainer(const dist::World& world, const core::Logger& log, TrainConfig config,
                 std::unique_ptr<StepSource> data, const std::atomic<bool>* stop,
                 const grpo::GenerationLink* link)
    : impl_(std::make_unique<Impl>(world, log, std::move(config), std::move(data), stop, link)) {}

Trainer::~Trainer() = default;

bool Trainer::step() {
  Impl& s = *impl_;
  if (s.done >= s.total || s.stopped) return false;
  s.ops.bind_thread();
  // Requests made since the last step (a signal, the host, the deadline) are agreed before this
  // one, so that a host asking between two steps gets no further step.
  if (!s.continue_at_boundary()) return false;
  core::fault_point("train.step", s.world.rank());
  const StepMetrics m = s.run_step();
  s.last_step = m;
  s.reporter.step(m, s.stop.bad_in_a_row(), s.stop.max_bad_steps());
  s.stop.check(m);
  s.checkpoints.finish_if_ready();
  // The evaluation of a step before its checkpoint: a run resumed from that checkpoint does not
  // evaluate the step again, so its result must be in the metrics the checkpoint covers.
  if (s.config.eval_every > 0 && s.done % s.config.eval_every == 0 && s.done < s.total)
    s.evaluate();
  if (s.config.checkpoint_every > 0 && s.done % s.config.checkpoint_every == 0 && s.done < s.total)
    s.checkpoint();
  if (const std::int64_t every = s.checkpoints.local_every();
      every > 0 && s.done % every == 0 && s.done < s.total && !s.checkpoints.has(s.done))
    s.local_checkpoint();
  return true;
}

TrainSummary Trainer::run() {
  Impl& s = *impl_;
  s.ops.bind_thread();
  // The starting point's evaluation (step 0), written before any checkpoint: a resumed run,
  // which has done steps, does not evaluate it again.
  if (s.config.eval_on_start && s.done == 0) s.evaluate();
  while (step()) {
  }
  s.progress.finish();
  if (!s.stopped) {
    const bool evaluated_already = s.parts->resumed && s.parts->resumed->evaluated;
    if (s.done > s.first_step || (!s.last_eval && !evaluated_already)) s.evaluate();
    if (s.done >= s.total) s.parts->data->finish();  // before the final checkpoint records it
    if (s.checkpoints.enabled()) s.checkpoint();
  }
  s.checkpoints.finish();
  s.parts->data->end_run(s.stopped);
  TrainSummary summary;
  summary.backend_report = s.ops.report();
  if (!summary.backend_report.empty()) s.log.info("{}", summary.backend_report);
  summary.steps = s.done - s.first_step;
  summary.first_step = s.first_step;
  summary.stopped = s.stopped;
  summary.skipped_steps = s.skipped;
  summary.last_step = s.last_step;
  summary.last_eval = s.last_eval;
  summary.checkpoint = s.checkpoints.last_directory();
  summary.seconds = s.run_seconds;
  summary.tokens_per_s =
      s.run_seconds > 0 ? static_cast<double>(s.run_tokens) / s.run_seconds : 0.0;
  return summary;
}

std::optional<EvalMetrics> Trainer::evaluate() {
  impl_->ops.bind_thread();
  return impl_->evaluate();
}

CheckpointReport Trainer::checkpoint() {
  Impl& s = *impl_;
  s.ops.bind_thread();
  RunCheckpoints& c = s.checkpoints;
  c.finish();
  if (!c.last_directory().empty() && c.last_step() == s.done) {
    // Nothing changed since the last one (written at this step, or resumed from).
    if (c.last_report().step == s.done && c.last_report().directory == c.last_directory())
      return c.last_report();
    return {.step = s.done, .directory = c.last_directory()};
  }
  if (!c.enabled()) throw core::usage_error("no --ckpt-dir: nowhere to write a checkpoint");
  s.checkpoint();
  c.finish();
  return c.last_report();
}

void Trainer::request_stop() noexcept { impl_->stop.request_stop(); }
void Trainer::request_checkpoint() noexcept { impl_->stop.request_checkpoint(); }
void Trainer::set_stop_check(std::function<bool()> check) {
  impl_->stop.set_stop_check(std::move(check));
}
void Trainer::on_step(std::function<void(const StepMetrics&)> callback) {
  impl_->reporter.on_step(std::move(callback));
}
void Trainer::on_eval(std::function<void(const EvalMetrics&)> callback) {
  impl_->reporter.on_eval(std::move(callback));
}
void Trainer::on_checkpoint(std::function<void(const CheckpointReport&)> callback) {
  impl_->checkpoints.on_commit(std::move(callback));
}
std::int64_t Trainer::steps_done() const noexcept { return impl_->done; }
std::int64_t Trainer::total_steps() const noexcept { return impl_->total; }
const TrainConfig& Trainer::config() const noexcept { return impl_->config; }
model::LlamaModel& Trainer::model() noexcept { return impl_->model; }
std::int64_t Trainer::backend_allocated_bytes() const noexcept {
  return impl_->ops.allocated_bytes();
}

}  // namespace l3::train
