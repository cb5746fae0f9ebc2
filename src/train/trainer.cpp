#include "train/trainer.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <vector>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/path_safety.hpp"
#include "core/timer.hpp"
#include "core/trace_range.hpp"
#include "dist/agree.hpp"
#include "dist/gather_strings.hpp"
#include "dist/mpi_check.hpp"
#include "io/hdf5/data_loader.hpp"
#include "io/tokenizer/special_tokens.hpp"
#include "kernels/backends.hpp"
#include "model/llama_model.hpp"
#include "train/data_parallel.hpp"
#include "train/evaluator.hpp"
#include "train/lr_schedule.hpp"
#include "train/memory_check.hpp"
#include "train/model_source.hpp"
#include "train/progress_bar.hpp"

namespace l3::train {

namespace {

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

std::int32_t pad_token(std::int64_t vocab_size) {
  return static_cast<std::int32_t>(vocab_size - tokenizer::kSpecialTokenCount) +
         static_cast<std::int32_t>(tokenizer::Special::finetune_right_pad);
}

data::DatasetIndex open_data(const dist::World& world, const std::string& directory, Phase phase,
                             const model::ModelConfig& model, const ModelSource& source,
                             bool ignore_tokenizer_mismatch) {
  data::DatasetExpectations expect;
  expect.kind = phase == Phase::sft ? data::SampleKind::sft : data::SampleKind::preference;
  expect.model_vocab = model.vocab_size;
  if (source.checkpoint) expect.model_tokenizer_sha256 = source.checkpoint->tokenizer_sha256;
  expect.ignore_tokenizer_mismatch = ignore_tokenizer_mismatch;
  return data::open_dataset(world, directory, expect);
}

}  // namespace

// The shards of config.data through the prefetching loader (created once the start position is
// known: the loader starts producing at once).
class ShardStepSource final : public StepSource {
 public:
  ShardStepSource(const dist::World& world, const data::DatasetIndex& index,
                  data::LoaderConfig config)
      : world_(world), index_(index), config_(config) {}
  void start(const StepShape& /*shape*/, data::Position from) override {
    loader_ = std::make_unique<data::DataLoader>(world_, index_, config_, from);
  }
  const data::StepData& next() override { return loader_->next(); }
  [[nodiscard]] double last_wait_ms() const override { return loader_->last_wait_ms(); }
  [[nodiscard]] std::optional<std::int64_t> steps_in_epoch(std::int64_t epoch) const override {
    return loader_->steps_in_epoch(epoch);
  }

 private:
  const dist::World& world_;
  const data::DatasetIndex& index_;
  data::LoaderConfig config_;
  std::unique_ptr<data::DataLoader> loader_;
};

struct Trainer::Impl {
  Impl(const dist::World& w, const core::Logger& l, TrainConfig c,
       std::unique_ptr<StepSource> host_data)
      : world(w), log(l), config(std::move(c)), data_source(std::move(host_data)) {
    config.validate();
    if (config.data_from_host != (data_source != nullptr))
      throw core::internal_error("Trainer: data_from_host and the data source disagree");
    ops = kernels::make_ops(config.backend, world.local_rank(),
                            {.device = config.device,
                             .attention = config.attention,
                             .deterministic = config.deterministic});
    check_outputs_writable();
    const std::string resume_dir = choose_resume();
    source = resolve_model_source(config.model, resume_dir.empty() ? config.init : resume_dir);
    const model::ModelConfig& mc = source.config;
    if (config.seq_len > mc.max_position_embeddings) {
      throw core::usage_error(fmt::format("--seq-len {} is longer than the model's {} positions",
                                          config.seq_len, mc.max_position_embeddings));
    }
    const model::HeadKind head =
        config.phase == Phase::sft ? model::HeadKind::language_model : model::HeadKind::reward;
    if (config.phase == Phase::sft && source.initial_head() == model::HeadKind::reward) {
      throw core::usage_error(
          fmt::format("--init {} is a reward model; SFT needs a language model", source.origin()));
    }
    if (!resume_dir.empty()) check_resume_config(*source.checkpoint);
    if (!config.data_from_host) {
      index =
          open_data(world, config.data, config.phase, mc, source, config.ignore_tokenizer_mismatch);
    }
    if (!config.val_data.empty()) {
      val_index = open_data(world, config.val_data, config.phase, mc, source,
                            config.ignore_tokenizer_mismatch);
    }

    // Nothing large is allocated before the run is known to fit. The check refuses what cannot
    // fit in any case: a pair is planned as one row (what pairs of up to half a row take), not
    // the plan's worst case of a row per sequence, and the prefetched data likewise.
    const bool cuda = ops->compute_dtype() != kernels::DType::f32;
    model::MemoryPlanInput planned = memory_plan_input(config, mc, cuda, world.size());
    planned.micro_batch_rows = config.micro_batch;
    require_memory(world, *ops,
                   {.backend = model::plan_training_memory(planned).lines,
                    .host = prefetch_host_bytes(config.global_batch / world.size(), config.seq_len,
                                                config.prefetch_depth),
                    .remedy = "--micro-batch, --seq-len or --global-batch, add --recompute or "
                              "--shard-gradients, run on more ranks, or check the model's config "
                              "(--dry-run-memory prints the whole plan)"});

    // In bf16 the fp32 master weights live in the optimizer, this rank's ZeRO-1 pieces only.
    const bool shard_master =
        ops->compute_dtype() != kernels::DType::f32 || config.master_in_optimizer;
    model = std::make_unique<model::LlamaModel>(
        mc, head, *ops,
        model::ModelOptions{.recompute = config.recompute,
                            .keep_master = !shard_master,
                            .own_gradients = !config.shard_gradients,
                            .fp32_gradients = config.fp32_gradients(world.size())});
    DataParallelConfig dp;
    dp.bucket_elements = std::max<std::int64_t>(
        model::ParameterLayout::kAlignment,
        static_cast<std::int64_t>(config.bucket_mb * 1024.0 * 1024.0 / sizeof(float)));
    dp.shard_optimizer = config.shard_optimizer;
    dp.shard_gradients = config.shard_gradients;
    // Several micro-batches per step (gradient accumulation): add them up in fp32.
    dp.fp32_reduced_gradients = config.fp32_gradients(world.size());
    dp.overlap = config.overlap_reduction;
    dp.shard_master = shard_master;
    dp.exchange =
        config.deterministic && config.grad_exchange == "auto" ? "mpi" : config.grad_exchange;
    const ModelWeights weights =
        shard_master
            ? ModelWeights{.master = {}, .compute = model->parameters()}
            : ModelWeights{.master = model->master_weights(), .compute = model->weight_copy()};
    parallel =
        std::make_unique<DataParallel>(world, *ops, model->layout(), dp, config.adamw, weights);
    if (config.shard_gradients) model->set_gradient_window(parallel.get());
    if (resume_dir.empty()) {
      const std::vector<float> initial = initialize_model(world, *model, source, config.seed);
      if (shard_master) parallel->load_master_from_whole(initial);
    } else {
      restore(resume_dir, *source.checkpoint);
    }
    if (!config.ckpt_dir.empty()) {
      writer = std::make_unique<ckpt::CheckpointWriter>(
          world, config.ckpt_dir,
          ckpt::WriterPolicy{.keep_last = config.keep_last, .async = !config.checkpoint_sync});
      // The snapshot buffer (this rank's share of the weights and both moments: 12 bytes per
      // parameter / ranks), allocated and touched now instead of in the first checkpoint's
      // pause, and reused by every checkpoint.
      ckpt::RankState spare;
      spare.allocate(snapshot_ranges());
      writer->provide_spare(std::move(spare));
    }

    data::LoaderConfig lc;
    lc.plan.seq_len = config.seq_len;
    lc.plan.global_batch = config.global_batch;
    lc.plan.micro_batch = config.micro_batch;
    lc.plan.world_size = world.size();
    lc.plan.seed = config.seed;
    lc.plan.long_samples = config.drop_long ? data::LongSamples::drop : data::LongSamples::truncate;
    lc.depth = config.prefetch_depth;
    lc.pad_id = pad_token(config.data_from_host ? mc.vocab_size : index.vocab_size);
    lc.model_vocab = mc.vocab_size;
    lc.margins_from_data = config.margin_from_data;
    if (config.margin_from_data && !config.data_from_host && !index.has_margin()) {
      throw core::usage_error(fmt::format(
          "--margin-from-data: the dataset {} has no margins (its records had no \"margin\")",
          config.data));
    }
    if (!data_source) {
      data_source = std::make_unique<ShardStepSource>(world, index, lc);
    }
    lc.plan.validate();  // --global-batch a multiple of ranks x --micro-batch, for any source
    data_source->start(StepShape{.phase = config.phase,
                                 .seq_len = config.seq_len,
                                 .per_rank = config.global_batch / world.size(),
                                 .micro_batch = config.micro_batch,
                                 .pad_id = lc.pad_id,
                                 .vocab_size = mc.vocab_size,
                                 .margins_from_data = config.margin_from_data,
                                 .rank = world.rank(),
                                 .ranks = world.size()},
                       position);

    if (config.steps > 0) {
      total = config.steps;
    } else {
      const std::int64_t epochs = config.epochs > 0 ? config.epochs : 1;
      for (std::int64_t e = 0; e < epochs; ++e) {
        const std::optional<std::int64_t> steps = data_source->steps_in_epoch(e);
        if (!steps) throw core::usage_error("give --steps: this data source has no epochs");
        total += *steps;
      }
    }
    schedule = {config.lr, config.min_lr < 0 ? 0.1 * config.lr : config.min_lr, config.warmup,
                total};

    peak_tflops = config.peak_tflops > 0
                      ? config.peak_tflops
                      : kernels::default_peak_tflops(ops->name(), world.local_rank());
    if (world.is_root() && !config.metrics.empty())
      metrics = std::make_unique<MetricsFile>(
          config.metrics,
          resume_dir.empty() ? std::nullopt : std::optional<std::int64_t>(first_step));
    progress = std::make_unique<ProgressBar>(config.progress && world.is_root());

    const std::int64_t params = model->layout().parameter_count();
    log.info("{} on {} rank{} ({} backend): model {} ({:.2f}M parameters), {} steps of {} {}",
             phase_name(config.phase), world.size(), world.size() == 1 ? "" : "s", ops->name(),
             source.initial_head() ? fmt::format("from {}", source.origin()) : mc.name,
             static_cast<double>(params) / 1e6, total, config.global_batch,
             config.phase == Phase::sft ? "rows" : "pairs");
    log.info(
        "data {}: {} samples, {} tokens; {} micro-batch{} of {} per rank and step; ZeRO-{}, "
        "gradients added up in {}, {} gradient bucket{}, reduction {} ({})",
        config.data_from_host ? "from the host (DataSource)" : config.data,
        config.data_from_host ? std::string("?") : fmt::format("{}", index.samples()),
        config.data_from_host ? std::string("?") : fmt::format("{}", index.total_tokens()),
        lc.plan.accumulation(), lc.plan.accumulation() == 1 ? "" : "es", config.micro_batch,
        config.shard_optimizer ? (config.shard_gradients ? "2" : "1") : "0 (off)",
        ops->compute_dtype() == kernels::DType::f32 || config.fp32_gradients(world.size()) ? "fp32"
                                                                                           : "bf16",
        parallel->buckets().size(), parallel->buckets().size() == 1 ? "" : "s",
        config.shard_gradients ? "of every micro-batch"
                               : (parallel->overlapping() ? "overlapped with the backward pass"
                                                          : "after the backward"),
        parallel->exchange_name());
  }

  StepMetrics run_step() {
    const core::Stopwatch watch;
    const core::TraceRange step_range("step {}", done + 1);
    const bool sft = config.phase == Phase::sft;
    // A source failing on some ranks only (a host's DataSource, a read error) must not leave
    // the others waiting in the step's collectives: the ranks agree first.
    const data::StepData* next = nullptr;
    std::exception_ptr failure;
    try {
      const core::TraceRange range("data");
      next = &data_source->next();
    } catch (...) {
      failure = std::current_exception();
    }
    dist::agree_on_failure(world, failure);
    const data::StepData& data = *next;
    const double wait_ms = data_source->last_wait_ms();
    (void)ops->take_input_wait_ms();  // waits before this step (evaluation) are not its own

    // The global denominators first: each rank's gradients are then already those of the
    // global mean.
    std::array<std::int64_t, 2> counts{0, 0};  // loss tokens or pairs, document tokens
    for (const model::Batch& b : data.micro) {
      counts[0] += sft ? b.counted_tokens() : b.pairs();
      counts[1] += b.document_tokens;
    }
    dist::check_mpi(
        MPI_Allreduce(MPI_IN_PLACE, counts.data(), 2, MPI_INT64_T, MPI_SUM, world.comm()),
        "MPI_Allreduce (step counts)");
    const float scale = counts[0] > 0 ? 1.0F / static_cast<float>(counts[0]) : 0.0F;

    model->zero_gradients();
    model->zero_loss_sums();
    parallel->begin_step(model->gradients());
    const bool zero2 = parallel->shards_gradients();
    for (std::size_t m = 0; m < data.micro.size(); ++m) {
      const model::Batch& batch = data.micro[m];
      // ZeRO-1 reduces during the last micro-batch's backward; ZeRO-2 during every one.
      const bool last = m + 1 == data.micro.size();
      const core::TraceRange range("micro-batch {}", m);
      if (zero2) parallel->begin_micro_batch();
      if (last && !zero2) {
        model->set_gradient_ready_hook(
            [this](std::int64_t offset) { parallel->gradients_ready(offset); });
      }
      if (sft && batch.document_tokens > 0) {
        model->sft_accumulate(batch, scale);
      } else if (!sft && batch.pairs() > 0) {
        model->reward_accumulate(batch, scale, config.center_rewards);
      }
      if (last && !zero2) model->set_gradient_ready_hook({});
      if (zero2) parallel->end_micro_batch();
    }
    {
      const core::TraceRange range("gradient reduction wait");
      parallel->finish_reduction();
    }
    double norm = 0;
    {
      // Queued right behind the backward: its one download is the step's wait for the GPU.
      const core::TraceRange range("gradient norm");
      norm = parallel->gradient_norm();
    }
    // The step's one read of its losses (the micro-batches added them up in backend memory);
    // the queue is empty by now, so it costs a small copy, not a second wait.
    const model::LossSums local = model->loss_sums();
    std::array<double, 3> sums{local.loss, local.correct, local.margin};
    dist::check_mpi(MPI_Allreduce(MPI_IN_PLACE, sums.data(), 3, MPI_DOUBLE, MPI_SUM, world.comm()),
                    "MPI_Allreduce (step loss)");

    StepMetrics m;
    m.step = done + 1;
    m.total_steps = total;
    m.epoch = data.position.epoch;
    m.lr = schedule.at(done);
    m.grad_norm = norm;
    m.tokens = counts[1];
    const auto denominator = static_cast<double>(counts[0]);
    m.loss = counts[0] > 0 ? sums[0] / denominator : std::nan("");
    if (sft) {
      m.loss_tokens = counts[0];
    } else {
      m.pairs = counts[0];
      m.accuracy = counts[0] > 0 ? sums[1] / denominator : 0.0;
      m.margin = counts[0] > 0 ? sums[2] / denominator : 0.0;
    }
    m.skipped = !std::isfinite(m.loss) || !std::isfinite(norm);
    core::fault_point("train.update", world.rank());  // gradients reduced, weights not updated
    if (!m.skipped) {
      const core::TraceRange range("optimizer update and weight all-gather");
      parallel->update(static_cast<float>(m.lr),
                       static_cast<float>(clip_factor(norm, config.grad_clip)));
      bad_in_a_row = 0;
    } else {
      ++bad_in_a_row;
      ++skipped;
    }
    ops->synchronize();
    position = data.next;
    ++done;

    m.step_ms = watch.milliseconds();
    // The host's wait for the prefetcher (the GPU's queue is empty then) plus the time the
    // backend's compute queue stood waiting for input copies during the step.
    m.data_wait_ms = wait_ms + ops->take_input_wait_ms();
    const ReductionTimes& t = parallel->times();
    m.reduce_wait_ms = 1e3 * t.wait_seconds;
    m.reduce_ms = 1e3 * t.reduce_seconds;
    m.gather_ms = 1e3 * t.gather_seconds;
    m.tokens_per_s = static_cast<double>(m.tokens) / std::max(1e-9, m.step_ms / 1e3);
    if (peak_tflops > 0) {
      m.mfu = m.tokens_per_s *
              model->config().training_flops_per_token(
                  config.seq_len, model->layout().head() == model::HeadKind::language_model) /
              (peak_tflops * 1e12 * world.size());
    }
    run_seconds += m.step_ms / 1e3;
    run_tokens += m.tokens;
    m.eta_seconds =
        run_seconds / static_cast<double>(done - first_step) * static_cast<double>(total - done);
    return m;
  }

  void report(const StepMetrics& m) {
    if (metrics) metrics->write(to_json(m));
    const bool log_now = m.skipped || m.step == 1 || m.step == total ||
                         (config.log_every > 0 && m.step % config.log_every == 0);
    if (log_now) {
      progress->clear();
      if (m.skipped) {
        log.warn("{} ({} in a row, at most {})", format_step_line(m), bad_in_a_row,
                 config.max_bad_steps);
      } else {
        log.info("{}", format_step_line(m));
      }
    }
    progress->update(m.step, total,
                     fmt::format("loss {:.4f} | eta {}", m.loss, format_duration(m.eta_seconds)));
    for (const auto& callback : step_callbacks) callback(m);
  }

  std::optional<EvalMetrics> evaluate() {
    if (config.val_data.empty()) return std::nullopt;
    EvalConfig ec;
    ec.seq_len = config.seq_len;
    ec.micro_batch = config.micro_batch;
    ec.margin_from_data = config.margin_from_data;
    ec.drop_long = config.drop_long;
    ec.prefetch_depth = config.prefetch_depth;
    EvalMetrics m = train::evaluate(world, *model, val_index, ec);
    m.step = done;
    if (metrics) metrics->write(to_json(m));
    progress->clear();
    log.info("{}", format_eval_line(m));
    for (const auto& callback : eval_callbacks) callback(m);
    last_eval = m;
    return m;
  }

  // ---- checkpoints -------------------------------------------------------------------

  // The checkpoint to resume from: rank 0 decides (--resume auto: the newest good one under
  // --ckpt-dir, broken ones renamed aside; --resume PATH: that one, which must be good),
  // every rank learns the decision. Empty: start fresh. Never silently starts over where
  // an earlier run left checkpoints: --resume none into a directory with checkpoints, and
  // --resume auto where every checkpoint is damaged, are refused (exit 2) with what to do.
  // Every output location is checked before any work is spent: a --ckpt-dir found unwritable
  // only at the first checkpoint would lose every step before it. Every rank writes its part of
  // a checkpoint's files; rank 0 the metrics.
  void check_outputs_writable() const {
    std::exception_ptr failure;
    try {
      if (!config.ckpt_dir.empty()) core::check_writable_directory(config.ckpt_dir, "--ckpt-dir");
      if (world.is_root() && !config.metrics.empty()) {
        const std::filesystem::path metrics_file = std::filesystem::absolute(config.metrics);
        core::check_writable_directory(metrics_file.parent_path(), "--metrics");
        if (core::is_real_directory(metrics_file))
          throw core::bad_input("--metrics names a directory, not a file",
                                {.file = config.metrics});
      }
    } catch (...) {
      failure = std::current_exception();
    }
    dist::agree_on_failure(world, failure);
  }

  std::string choose_resume() {
    if (config.ckpt_dir.empty()) return {};
    std::string chosen;
    std::string failure;
    std::vector<std::string> rejected;
    if (world.is_root()) {
      try {
        const std::vector<std::string> earlier = ckpt::step_directories(config.ckpt_dir);
        if (config.resume == "none") {
          if (!earlier.empty()) {
            throw core::usage_error(fmt::format(
                "--resume none: {} holds checkpoints of an earlier run (newest {}); a new run "
                "would mix its checkpoints with them: choose another --ckpt-dir, remove them, "
                "or resume (--resume auto)",
                config.ckpt_dir, earlier.front()));
          }
        } else if (config.resume == "auto") {
          const std::vector<std::string> damaged = ckpt::damaged_directories(config.ckpt_dir);
          if (earlier.empty() && !damaged.empty()) {
            throw core::bad_input(
                fmt::format("no good checkpoint to resume from, only damaged ones set aside "
                            "(newest {}; see why-damaged.txt in it). Resume from one of your "
                            "choice with --resume PATH, or start over with --resume none",
                            damaged.front()),
                {.file = config.ckpt_dir});
          }
          if (!earlier.empty()) {
            const ckpt::ResumePick pick =
                ckpt::pick_resume_checkpoint(config.ckpt_dir, config.verify_resume);
            chosen = pick.step_dir;
            rejected = pick.rejected;
            if (chosen.empty()) {
              std::string why;
              for (const std::string& r : pick.rejected) why += "; " + r;
              throw core::bad_input(fmt::format("no good checkpoint to resume from: every one is "
                                                "damaged and now set aside as "
                                                "step-N.damaged{}. Resume from one of your choice "
                                                "with --resume PATH, or start "
                                                "over with --resume none",
                                                why),
                                    {.file = config.ckpt_dir});
            }
          }
        } else {
          chosen = ckpt::resolve_checkpoint(config.resume);
          const ckpt::Verification v = ckpt::verify_checkpoint(chosen, config.verify_resume);
          if (!v.ok) {
            throw core::bad_input(fmt::format("cannot resume from it: {}", v.problem),
                                  {.file = chosen});
          }
        }
      } catch (...) {
        failure = core::summarize(std::current_exception()).text;
      }
    }
    failure = dist::broadcast_string(world.comm(), failure);
    if (!failure.empty()) throw core::bad_input(failure);
    chosen = dist::broadcast_string(world.comm(), chosen);
    for (const std::string& r : rejected) log.warn("checkpoint {} is damaged, set aside", r);
    if (!chosen.empty()) log.info("resuming from {}", chosen);
    return chosen;
  }

  // A resumed run must do the same math: the options that change it must not change
  // (--steps, cadences, output and performance options may).
  void check_resume_config(const ckpt::Manifest& manifest) const {
    if (manifest.phase != phase_name(config.phase)) {
      throw core::usage_error(fmt::format("{} is a {} checkpoint; this is a {} run",
                                          source.step_dir, manifest.phase,
                                          phase_name(config.phase)));
    }
    if (config.allow_config_change) return;
    const nlohmann::json now = config.to_json();
    std::string changed;
    for (const char* key : {"data", "seq_len", "global_batch", "drop_long", "lr", "min_lr",
                            "warmup", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "seed",
                            "margin_from_data", "center_rewards", "epochs"}) {
      if (manifest.config.contains(key) && manifest.config[key] != now[key]) {
        // The config keys are the option names with '_' for '-'.
        std::string option = std::string(key) == "eps" ? "adam-eps" : key;
        std::ranges::replace(option, '_', '-');
        changed += fmt::format("{}--{} {} (was {})", changed.empty() ? "" : ", ", option,
                               now[key].dump(), manifest.config[key].dump());
      }
    }
    if (!changed.empty()) {
      throw core::usage_error(fmt::format(
          "resuming {} with options that change the training: {}; restore them, or pass "
          "--allow-config-change, or start over in a new --ckpt-dir",
          source.step_dir, changed));
    }
  }

  void restore(const std::string& step_dir, const ckpt::Manifest& manifest) {
    const core::Stopwatch watch;
    std::vector<ckpt::FlatRange> ranges;
    for (const Range& r : parallel->state_ranges()) ranges.push_back({r.begin, r.end});
    std::exception_ptr failure;
    ckpt::RankState state;
    try {
      state = ckpt::read_rank_state(step_dir, model->layout(), ranges);
    } catch (...) {
      failure = std::current_exception();
    }
    dist::agree_on_failure(world, failure);
    std::vector<Range> parallel_ranges;
    for (const ckpt::FlatRange& r : state.ranges) parallel_ranges.push_back({r.begin, r.end});
    parallel->load_master(parallel_ranges, state.master);
    parallel->load_moments(parallel_ranges, state.exp_avg, state.exp_avg_sq);
    parallel->set_adamw_steps(manifest.adamw_step);
    parallel->gather_parameters();
    ops->synchronize();
    done = first_step = manifest.step;
    position = {manifest.data_epoch, manifest.data_step};
    skipped = manifest.skipped_steps;
    prior_tokens = manifest.trained_tokens;
    prior_seconds = manifest.trained_seconds;
    last_checkpoint = step_dir;
    last_checkpoint_step = done;
    log.info(
        "resumed at step {} (data epoch {} step {}, {} AdamW updates) from {} written by {} "
        "rank{} in {:.2f} s",
        done, position.epoch, position.step, manifest.adamw_step, step_dir, manifest.world_size,
        manifest.world_size == 1 ? "" : "s", watch.seconds());
  }

  // This rank's pieces of the flat layout in a checkpoint (its ZeRO-1 shard).
  [[nodiscard]] std::vector<ckpt::FlatRange> snapshot_ranges() const {
    const std::vector<Range> mine = parallel->write_ranges();
    std::vector<ckpt::FlatRange> ranges;
    ranges.reserve(mine.size());
    for (const Range& r : mine) ranges.push_back({r.begin, r.end});
    return ranges;
  }

  // Starts a checkpoint of the current state (in the background unless --checkpoint-sync).
  void checkpoint() {
    if (!writer) throw core::usage_error("no --ckpt-dir: nowhere to write a checkpoint");
    finish_checkpoint();  // the previous one first
    const core::Stopwatch watch;
    ckpt::Manifest manifest;
    manifest.step = done;
    manifest.phase = std::string(phase_name(config.phase));
    manifest.head = model->layout().head();
    manifest.model = model->config();
    manifest.world_size = world.size();
    manifest.data_epoch = position.epoch;
    manifest.data_step = position.step;
    manifest.finished = done >= total;
    manifest.tokenizer_sha256 = index.tokenizer_sha256;
    manifest.tokenizer = index.tokenizer_name;
    manifest.config = config.to_json();
    const core::BuildInfo build = core::build_info();
    manifest.program_version = build.version;
    manifest.git_commit = build.git_commit;
    for (const core::LibraryVersion& library : core::library_versions())
      manifest.libraries[library.name] = library.version;
    manifest.created_utc = utc_now();
    manifest.adamw_step = parallel->adamw_steps();
    manifest.skipped_steps = skipped;
    manifest.trained_tokens = prior_tokens + run_tokens;
    manifest.trained_seconds = prior_seconds + run_seconds;
    // What the schedule and the random streams need is the step and the data position above;
    // these say so explicitly, for readers and for checks on resume.
    manifest.schedule = {{"kind", "linear warmup, cosine decay"},
                         {"lr", schedule.lr},
                         {"min_lr", schedule.min_lr},
                         {"warmup", schedule.warmup},
                         {"total_steps", schedule.total},
                         {"next_lr", schedule.at(done)}};
    manifest.rng = {{"generator", "philox4x32-10"},
                    {"seed", config.seed},
                    {"state",
                     "counter-based: every draw is keyed by (seed, purpose, stream, index) and "
                     "the data order by (seed, epoch); nothing else to save"}};
    manifest.metrics = nlohmann::json::object();
    if (last_step) manifest.metrics["last_step"] = to_json(*last_step);
    if (last_eval) manifest.metrics["last_eval"] = to_json(*last_eval);

    // The host snapshot: this rank's pieces of the master weights and moments, in the previous
    // checkpoint's buffers when there was one.
    const core::TraceRange range("checkpoint snapshot");
    ckpt::RankState state = writer->take_spare();
    const std::vector<Range> mine = parallel->write_ranges();
    state.allocate(snapshot_ranges());
    parallel->save_master(mine, state.master);
    parallel->save_moments(mine, state.exp_avg, state.exp_avg_sq);
    writer->write(model->layout(), std::move(manifest), std::move(state));
    snapshot_seconds = watch.seconds();
    pending_step = done;
    if (!writer->busy()) finish_checkpoint();
  }

  // Waits for the checkpoint in flight, if any, and reports it.
  void finish_checkpoint() {
    if (!writer || !writer->busy()) return;
    const std::optional<ckpt::WriteReport> report = writer->wait();
    if (!report) return;
    progress->clear();
    log.info(
        "checkpoint {} committed: {:.1f} MB in {:.2f} s (training paused {:.3f} s for the "
        "snapshot)",
        report->directory, static_cast<double>(report->bytes) / 1e6, report->seconds,
        snapshot_seconds);
    checkpoint_seconds = std::max(checkpoint_seconds, report->seconds);
    last_checkpoint = report->directory;
    last_checkpoint_step = pending_step;
    const CheckpointReport committed{.step = pending_step,
                                     .directory = report->directory,
                                     .bytes = report->bytes,
                                     .seconds = report->seconds};
    last_report = committed;
    for (const auto& callback : checkpoint_callbacks) callback(committed);
  }

  // ---- stopping early ----------------------------------------------------------------

  // What the ranks agree to do at this step boundary (bits of kStopNow, kCheckpointNow): stop
  // when a stop was requested on any rank (a signal, the host application) or the deadline is
  // closer than a step plus a checkpoint plus margin; checkpoint when any rank asked for one.
  static constexpr int kStopNow = 1;
  static constexpr int kCheckpointNow = 2;
  int boundary_agreement() {
    int local = stop_requested.load() ? kStopNow : 0;
    if (checkpoint_requested.exchange(false)) local |= kCheckpointNow;
    if (stop_check && stop_check()) local |= kStopNow;
    if (config.deadline_unix > 0 && writer && done > first_step) {
      const double step_seconds = run_seconds / static_cast<double>(done - first_step);
      const double needed = 2.0 * step_seconds + 1.5 * checkpoint_seconds + config.deadline_margin;
      const double now =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      if (now + needed >= config.deadline_unix) {
        if (!deadline_hit) {
          log.warn(
              "the deadline is {:.0f} s away, less than the {:.0f} s a step, a checkpoint and "
              "the margin need: checkpointing and stopping",
              config.deadline_unix - now, needed);
        }
        deadline_hit = true;
        local |= kStopNow;
      }
    }
    dist::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &local, 1, MPI_INT, MPI_BOR, world.comm()),
                    "MPI_Allreduce (step boundary agreement)");
    return local;
  }

  const dist::World& world;
  const core::Logger& log;
  TrainConfig config;
  std::unique_ptr<kernels::Ops> ops;
  ModelSource source;
  data::DatasetIndex index;
  data::DatasetIndex val_index;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<StepSource> data_source;
  std::unique_ptr<DataParallel> parallel;
  std::unique_ptr<MetricsFile> metrics;
  std::unique_ptr<ProgressBar> progress;
  LrSchedule schedule;
  double peak_tflops = 0;
  std::int64_t total = 0;
  std::int64_t done = 0;
  std::int64_t first_step = 0;  // steps done before this run started
  data::Position position{0, 0};
  int bad_in_a_row = 0;
  std::int64_t skipped = 0;
  double run_seconds = 0;
  std::int64_t run_tokens = 0;
  std::optional<StepMetrics> last_step;
  std::optional<EvalMetrics> last_eval;
  std::string last_checkpoint;
  std::int64_t last_checkpoint_step = -1;
  std::unique_ptr<ckpt::CheckpointWriter> writer;
  std::int64_t pending_step = -1;
  double snapshot_seconds = 0;
  double checkpoint_seconds = 0;  // the longest write so far (for the deadline)
  std::int64_t prior_tokens = 0;  // trained before this run (resumed)
  double prior_seconds = 0;
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> checkpoint_requested{false};
  CheckpointReport last_report;
  std::function<bool()> stop_check;
  bool deadline_hit = false;
  bool stopped = false;
  std::vector<std::function<void(const StepMetrics&)>> step_callbacks;
  std::vector<std::function<void(const EvalMetrics&)>> eval_callbacks;
  std::vector<std::function<void(const CheckpointReport&)>> checkpoint_callbacks;
};

Trainer::Trainer(const dist::World& world, const core::Logger& log, TrainConfig config,
                 std::unique_ptr<StepSource> data)
    : impl_(std::make_unique<Impl>(world, log, std::move(config), std::move(data))) {}

Trainer::~Trainer() = default;

bool Trainer::step() {
  Impl& s = *impl_;
  if (s.done >= s.total || s.stopped) return false;
  s.ops->bind_thread();
  // Requests made since the last step (a signal, the host, the deadline) are agreed before this
  // one, so that a host asking between two steps gets no further step.
  const int agreed = s.boundary_agreement();
  if ((agreed & Impl::kStopNow) != 0) {
    s.progress->clear();
    s.log.warn("stopping at step {} of {} on request: {}", s.done, s.total,
               s.writer ? "writing a checkpoint" : "no --ckpt-dir, nothing to save");
    s.stopped = true;
    if (s.writer && s.last_checkpoint_step != s.done && s.pending_step != s.done) s.checkpoint();
    s.finish_checkpoint();
    return false;
  }
  if ((agreed & Impl::kCheckpointNow) != 0) {
    if (!s.writer) {
      s.log.warn("a checkpoint was requested at step {}, but there is no --ckpt-dir to write it to",
                 s.done);
    } else if (s.last_checkpoint_step != s.done && s.pending_step != s.done) {
      s.checkpoint();
    }
  }
  core::fault_point("train.step", s.world.rank());
  const StepMetrics m = s.run_step();
  s.last_step = m;
  s.report(m);
  const bool sft = s.config.phase == Phase::sft;
  if (s.bad_in_a_row >= s.config.max_bad_steps && (sft ? m.loss_tokens : m.pairs) == 0) {
    // Not a divergence: nothing to learn from (every answer cut off by --seq-len, or no pair
    // fits), which no --lr fixes. The data and options are what must change: exit 2.
    throw core::bad_input(fmt::format(
        "{} steps in a row had no {} (last: step {}): the samples are cut to --seq-len {} before "
        "their {}; raise --seq-len, or leave long samples out with --drop-long",
        s.bad_in_a_row, sft ? "target tokens" : "preference pairs", m.step, s.config.seq_len,
        sft ? "answers" : "ends"));
  }
  if (s.bad_in_a_row >= s.config.max_bad_steps) {
    throw core::internal_error(fmt::format(
        "training diverged: {} steps in a row had a non-finite loss or gradient norm (last: "
        "step {}, loss {}, grad norm {}); lower --lr, raise --warmup or check the data",
        s.bad_in_a_row, m.step, m.loss, m.grad_norm));
  }
  if (s.writer && s.writer->ready()) s.finish_checkpoint();
  if (s.config.checkpoint_every > 0 && s.done % s.config.checkpoint_every == 0 && s.done < s.total)
    s.checkpoint();
  if (s.config.eval_every > 0 && s.done % s.config.eval_every == 0 && s.done < s.total)
    s.evaluate();
  return true;
}

TrainSummary Trainer::run() {
  Impl& s = *impl_;
  s.ops->bind_thread();
  while (step()) {
  }
  s.progress->finish();
  if (!s.stopped) {
    if (s.done > s.first_step || !s.last_eval) s.evaluate();
    if (s.writer && s.last_checkpoint_step != s.done && s.pending_step != s.done) s.checkpoint();
  }
  s.finish_checkpoint();
  TrainSummary summary;
  summary.backend_report = s.ops->report();
  if (!summary.backend_report.empty()) s.log.info("{}", summary.backend_report);
  summary.steps = s.done - s.first_step;
  summary.first_step = s.first_step;
  summary.stopped = s.stopped;
  summary.skipped_steps = s.skipped;
  summary.last_step = s.last_step;
  summary.last_eval = s.last_eval;
  summary.checkpoint = s.last_checkpoint;
  summary.seconds = s.run_seconds;
  summary.tokens_per_s =
      s.run_seconds > 0 ? static_cast<double>(s.run_tokens) / s.run_seconds : 0.0;
  return summary;
}

std::optional<EvalMetrics> Trainer::evaluate() {
  impl_->ops->bind_thread();
  return impl_->evaluate();
}
CheckpointReport Trainer::checkpoint() {
  Impl& s = *impl_;
  s.ops->bind_thread();
  s.finish_checkpoint();
  if (!s.last_checkpoint.empty() && s.last_checkpoint_step == s.done) {
    // Nothing changed since the last one (written at this step, or resumed from).
    if (s.last_report.step == s.done && s.last_report.directory == s.last_checkpoint)
      return s.last_report;
    return {.step = s.done, .directory = s.last_checkpoint};
  }
  s.checkpoint();
  s.finish_checkpoint();
  return s.last_report;
}
void Trainer::request_stop() noexcept { impl_->stop_requested.store(true); }
void Trainer::request_checkpoint() noexcept { impl_->checkpoint_requested.store(true); }
void Trainer::set_stop_check(std::function<bool()> check) { impl_->stop_check = std::move(check); }
void Trainer::on_step(std::function<void(const StepMetrics&)> callback) {
  impl_->step_callbacks.push_back(std::move(callback));
}
void Trainer::on_eval(std::function<void(const EvalMetrics&)> callback) {
  impl_->eval_callbacks.push_back(std::move(callback));
}
void Trainer::on_checkpoint(std::function<void(const CheckpointReport&)> callback) {
  impl_->checkpoint_callbacks.push_back(std::move(callback));
}
std::int64_t Trainer::steps_done() const noexcept { return impl_->done; }
std::int64_t Trainer::total_steps() const noexcept { return impl_->total; }
const TrainConfig& Trainer::config() const noexcept { return impl_->config; }
model::LlamaModel& Trainer::model() noexcept { return *impl_->model; }

}  // namespace l3::train
