#include "train/trainer_parts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checksum.hpp"
#include "ckpt/local_restore.hpp"
#include "ckpt/peft_adapter.hpp"
#include "ckpt/resume.hpp"
#include "core/error.hpp"
#include "core/output_file.hpp"
#include "core/path_safety.hpp"
#include "core/timer.hpp"
#include "core/words.hpp"
#include "dist/collectives.hpp"
#include "io/data/data_loader.hpp"
#include "io/tokenizer/special_tokens.hpp"
#include "kernels/backends.hpp"
#include "parallel/placement_choice.hpp"
#include "train/evaluator.hpp"
#include "train/grpo/rollout_source.hpp"
#include "train/lora_checkpoint_model.hpp"
#include "train/memory_check.hpp"
#include "train/model_assembly.hpp"
#include "train/objectives/objective_registry.hpp"
#include "train/resume_point.hpp"
#include "train/run_identity.hpp"
#include "train/stop_policy.hpp"

namespace l3::train {

namespace {

std::int32_t pad_token(std::int64_t vocab_size) {
  return static_cast<std::int32_t>(vocab_size - tokenizer::kSpecialTokenCount) +
         static_cast<std::int32_t>(tokenizer::Special::finetune_right_pad);
}

data::DatasetIndex open_data(const dist::World& world, const std::string& directory, Phase phase,
                             const model::ModelConfig& model, const ModelSource& source,
                             bool ignore_tokenizer_mismatch) {
  data::DatasetExpectations expect;
  expect.kind = phase == Phase::sft    ? data::SampleKind::sft
                : phase == Phase::grpo ? data::SampleKind::prompt
                                       : data::SampleKind::preference;
  // DPO counts the responses' tokens: shards of an earlier prep have no masks for them.
  auto require_masks = [&](const data::DatasetIndex& index) {
    if (phase == Phase::dpo && !index.has_response_masks()) {
      throw core::bad_input(
          "its pairs have no response masks (/chosen/loss_mask: prepared by an earlier "
          "llama3-hpc); run 'llama3-hpc prep preference' on it again to train DPO",
          {.file = directory});
    }
    return index;
  };
  expect.model_vocab = model.vocab_size;
  if (source.checkpoint) expect.model_tokenizer_sha256 = source.checkpoint->tokenizer_sha256;
  expect.ignore_tokenizer_mismatch = ignore_tokenizer_mismatch;
  return require_masks(data::open_dataset(world, directory, expect));
}

// The shards of config.data through the prefetching loader (created once the start position
// is known: the loader starts producing at once).
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

// Every output location is checked before any work is spent: a --ckpt-dir found unwritable
// only at the first checkpoint would lose every step before it. Every rank writes its part of
// a checkpoint's files; rank 0 the metrics.
void check_outputs_writable(const dist::World& world, const TrainConfig& config) {
  std::exception_ptr failure;
  try {
    if (!config.ckpt_dir.empty()) core::check_writable_directory(config.ckpt_dir, "--ckpt-dir");
    if (world.is_root() && !config.tensorboard.empty())
      core::check_writable_directory(config.tensorboard, "--tensorboard");
    if (world.is_root() && !config.metrics.empty()) {
      const std::filesystem::path metrics_file = std::filesystem::absolute(config.metrics);
      core::check_writable_directory(metrics_file.parent_path(), "--metrics");
      core::require_output_file(config.metrics, "--metrics");
    }
    if (const std::string& log = config.grpo.log_completions; world.is_root() && !log.empty()) {
      const std::filesystem::path file = std::filesystem::absolute(log);
      core::check_writable_directory(file.parent_path(), "--log-completions");
      core::require_output_file(log, "--log-completions");
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
}

// Rank 0's metrics.jsonl and TensorBoard files, which a resumed run first trims to the steps
// it continues from. Collective: a file rank 0 cannot open fails every rank.
void open_metrics_sinks(const dist::World& world, const core::Logger& log, TrainerParts& p) {
  const TrainConfig& c = p.config;
  const std::optional<std::int64_t> resumed_at =
      p.resumed ? std::optional<std::int64_t>(p.resumed->step) : std::nullopt;
  std::exception_ptr failure;
  try {
    if (world.is_root() && !c.metrics.empty())
      p.metrics = std::make_unique<MetricsFile>(c.metrics, resumed_at);
    if (world.is_root() && !c.tensorboard.empty()) {
      p.tensorboard = std::make_unique<tensorboard::TensorBoardWriter>(c.tensorboard, c.phase,
                                                                       p.run_id, resumed_at, log);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
}

// Nothing large is allocated before the run is known to fit. The check refuses what cannot
// fit in any case: a pair is planned as one row (what pairs of up to half a row take), not the
// plan's worst case of a row per sequence, and the prefetched data likewise.
void require_training_memory(const dist::World& world, const kernels::Ops& ops,
                             const TrainConfig& config, const model::ModelConfig& model) {
  const bool cuda = ops.compute_dtype() != kernels::DType::f32;
  model::MemoryPlanInput planned = memory_plan_input(config, model, cuda, world.size());
  planned.micro_batch_rows = config.micro_batch;
  require_memory(
      world, ops,
      {.backend = model::plan_training_memory(planned).lines,
       .host = prefetch_host_bytes(
           config.global_batch /
               std::max(world.size() / (config.context_parallel * config.tensor_parallel), 1),
           config.seq_len, config.prefetch_depth),
       .remedy = "--micro-batch, --seq-len or --global-batch, add --recompute, "
                 "--shard-gradients or --shard-parameters, split each sequence over ranks "
                 "(--context-parallel) or each layer (--tensor-parallel), run on more ranks, or "
                 "check the model's config "
                 "(--dry-run-memory prints the whole plan)"});
}

parallel::DataParallelConfig data_parallel_config(const TrainConfig& config,
                                                  const model::Placement& placement) {
  return {
      .bucket_elements = std::max<std::int64_t>(
          model::ParameterLayout::kAlignment,
          static_cast<std::int64_t>(config.bucket_mb * 1024.0 * 1024.0 / sizeof(float))),
      .placement = placement,
      .overlap = config.overlap_reduction,
      .prefetch_gathers = config.prefetch_gathers,
      .exchange = config.deterministic && config.grad_exchange == ExchangeChoice::automatic
                      ? ExchangeChoice::mpi
                      : config.grad_exchange,
  };
}

std::int64_t count_steps(const TrainConfig& config, const StepSource& data) {
  if (config.steps > 0) return config.steps;
  std::int64_t total = 0;
  const std::int64_t epochs = config.epochs > 0 ? config.epochs : 1;
  for (std::int64_t e = 0; e < epochs; ++e) {
    const std::optional<std::int64_t> steps = data.steps_in_epoch(e);
    if (!steps) throw core::usage_error("give --steps: this data source has no epochs");
    total += *steps;
  }
  return total;
}

std::string lora_description(const std::optional<model::LoraConfig>& lora) {
  if (!lora || !lora->enabled()) return "the weights of full fine-tuning";
  return fmt::format("LoRA adapters of rank {} on {}", lora->rank, lora->targets_text());
}

// A LoRA run resumes a LoRA checkpoint of the same rank and targets (its tensors), a full
// fine-tuning run a full one.
void check_lora_resume(const ckpt::Manifest& m, const std::string& step_dir,
                       const model::LoraConfig& lora) {
  if (!m.lora && !lora.enabled()) return;
  if (m.lora && lora.enabled() && m.lora->rank == lora.rank && m.lora->targets == lora.targets)
    return;
  throw core::usage_error(
      fmt::format("{} holds {}; this run would train {}: give the same --lora-rank and "
                  "--lora-targets, or start over in a new --ckpt-dir",
                  step_dir, lora_description(m.lora), lora_description(lora)));
}

// One tensor of the initial weights, read by rank 0 (ModelTensorReader) and broadcast.
// Collective.
std::vector<float> initial_tensor(const dist::World& world, const ModelSource& source,
                                  const model::ParameterLayout& layout, std::uint64_t seed,
                                  std::string_view name) {
  const model::TensorInfo& t = layout.find(name);
  std::vector<float> values(static_cast<std::size_t>(t.numel), 0.0F);
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      ModelTensorReader(source, layout, seed).read(t, values);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
  dist::broadcast_bytes(world.comm(), values.data(), values.size() * sizeof(float), 0);
  return values;
}

// The adapters a fresh LoRA run starts from: PEFT's initialisation (A Kaiming-uniform, B zero),
// or the PEFT adapter directory of --init-adapter, read by rank 0 and broadcast. Collective.
std::vector<float> starting_adapters(const dist::World& world, const core::Logger& log,
                                     const TrainConfig& c, const model::LlamaModel& model,
                                     std::span<const float> score) {
  if (c.init_adapter.empty()) return model.initial_adapter_values(c.seed, score);
  const model::ParameterLayout& layout = model.trainable_layout();
  std::vector<float> adapters(static_cast<std::size_t>(layout.total()), 0.0F);
  // Every rank reads the (small) config, so that a refusal is the same message everywhere.
  const ckpt::PeftAdapterConfig config = ckpt::read_peft_adapter_config(c.init_adapter);
  if (config.head != layout.head()) {
    throw core::bad_input(
        fmt::format("{} cannot start a {} run, which trains {}", ckpt::adapter_kind(config.head),
                    phase_name(c.phase), ckpt::adapter_kind(layout.head())),
        {.file = (std::filesystem::path(c.init_adapter) / "adapter_config.json").string()});
  }
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      adapters = ckpt::read_peft_adapter(c.init_adapter, layout);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
  dist::broadcast_bytes(world.comm(), adapters.data(), adapters.size() * sizeof(float), 0);
  log.info("LoRA: the adapters start from {}", c.init_adapter);
  return adapters;
}

void log_plan(const dist::World& world, const core::Logger& log, const TrainerParts& p) {
  const TrainConfig& config = p.config;
  const std::int64_t params =
      model::ParameterLayout(p.model->whole_config(), p.model->layout().head()).parameter_count();
  const model::Placement& place = p.placement;
  std::string grid;
  if (place.context_parallel > 1 || place.tensor_parallel > 1) {
    grid = fmt::format(" = {} data-parallel group{}", place.data_parallel_ranks(),
                       place.data_parallel_ranks() == 1 ? "" : "s");
    if (place.context_parallel > 1) {
      grid += fmt::format(" x context parallel {} (each sequence in 2 x {} chunks of {} tokens)",
                          place.context_parallel, place.context_parallel,
                          config.seq_len / (2 * place.context_parallel));
    }
    if (place.tensor_parallel > 1) {
      const model::ModelConfig& slice = p.model->config();
      grid += fmt::format(
          " x tensor parallel {} (each rank {} of {} heads, {} of {} MLP columns, {} of {} "
          "vocabulary rows)",
          place.tensor_parallel, slice.n_heads, p.model->whole_config().n_heads,
          slice.intermediate_size, p.model->whole_config().intermediate_size, slice.vocab_size,
          p.model->whole_config().vocab_size);
    }
  }
  log.info(
      "{} on {} rank{}{} ({} backend): model {} ({:.2f}M parameters{}), {} of {} {}",
      phase_name(config.phase), world.size(), world.size() == 1 ? "" : "s", grid, p.ops->name(),
      p.source.initial_head() ? fmt::format("from {}", p.source.origin()) : p.source.config.name,
      static_cast<double>(params) / 1e6,
      p.model->has_adapters()
          ? fmt::format(", frozen; trained: {}, {:.3f}M parameters", lora_description(config.lora),
                        static_cast<double>(p.model->trainable_layout().parameter_count()) / 1e6)
          : "",
      core::count_of(p.total_steps, "step"), config.global_batch,
      config.phase == Phase::sft ? (config.global_batch == 1 ? "row" : "rows")
      : config.phase == Phase::grpo
          ? fmt::format("prompts x {} completions", config.grpo.num_generations)
          : (config.global_batch == 1 ? "pair" : "pairs"));
  const std::size_t buckets = p.parallel->buckets().size();
  log.info(
      "data {}: {} samples, {} tokens; {} micro-batch{} of {} per rank and step; ZeRO-{}, "
      "gradients added up in {}, {} gradient bucket{}, reduction {} ({})",
      config.data_from_host ? "from the host (DataSource)" : config.data,
      config.data_from_host ? std::string("?") : fmt::format("{}", p.index.samples()),
      config.data_from_host ? std::string("?") : fmt::format("{}", p.index.total_tokens()),
      config.accumulation(world.size()), config.accumulation(world.size()) == 1 ? "" : "es",
      config.micro_batch, p.placement.stage_name(),
      p.ops->compute_dtype() == kernels::DType::f32 || config.fp32_gradients(world.size()) ? "fp32"
                                                                                           : "bf16",
      buckets, buckets == 1 ? "" : "s",
      p.placement.reduction_description(p.parallel->overlapping()), p.parallel->exchange_name());
}

// What checkpoints record of a LoRA run's reference (DPO's, GRPO's): the base model the adapters
// train on, which the run checks on resume.
nlohmann::json base_model_reference(const TrainerParts& p) {
  return {{"kind", "base model without adapters"},
          {"model", p.lora_base},
          {"model_xxh64", p.lora_base_xxh64}};
}

// DPO's reference. LoRA: the base model without adapters (nothing to prepare). Full
// fine-tuning: the initial model's log-probabilities of every training (and validation) pair,
// read from the reference directory when they were computed from the same data and model
// (a restart), else computed now and stored there. A resumed run reads the ones its checkpoint
// recorded: the initial model is gone. Collective.
void prepare_dpo_reference(const dist::World& world, const core::Logger& log, TrainerParts& p,
                           const data::LoaderConfig& training,
                           const std::optional<ckpt::Manifest>& resumed,
                           const std::string& initial_digest) {
  const TrainConfig& c = p.config;
  if (c.lora.enabled()) {
    p.reference_record = base_model_reference(p);
    log.info(
        "DPO reference: the base model without the adapters (a forward pass more per "
        "micro-batch, no second copy of the weights)");
    return;
  }
  std::string model_xxh64 = initial_digest;
  std::string model_origin = p.source.origin();
  if (resumed) {
    model_xxh64 = resumed->reference.value("model_xxh64", "");
    model_origin = resumed->reference.value("model", "");
    if (model_xxh64.empty()) {
      throw core::bad_input("the checkpoint records no DPO reference (\"reference\")",
                            {.file = p.source.step_dir});
    }
  }
  const bool mean = c.dpo.loss == kernels::PreferenceLoss::ipo;
  const std::string directory = !c.reference_dir.empty() ? c.reference_dir
                                : !c.ckpt_dir.empty()
                                    ? (std::filesystem::path(c.ckpt_dir) / "reference").string()
                                    : std::string();
  if (!directory.empty()) {
    check_reference_directory(
        world, directory, c.reference_dir.empty() ? "--ckpt-dir's reference/" : "--reference-dir");
  }
  struct Part {
    const char* name;
    const data::DatasetIndex* index;
    data::LoaderConfig loader;
    ReferenceTable* table;
  };
  std::vector<Part> parts{{"train", &p.index, training, &p.reference}};
  if (!c.val_data.empty()) {
    parts.push_back(
        {"val", &p.val_index,
         evaluation_loader(p.data_world(world), *p.model, p.val_index, validation_config(c)),
         &p.val_reference});
  }
  nlohmann::json files = nlohmann::json::object();
  for (Part& part : parts) {
    const ReferenceKey key{
        .data_xxh64 = data_digest(world, *part.index), .model_xxh64 = model_xxh64, .mean = mean};
    const std::string file =
        directory.empty()
            ? std::string()
            : (std::filesystem::path(directory) / fmt::format("{}.h5", part.name)).string();
    std::string why = "no --ckpt-dir or --reference-dir: kept in memory";
    if (!file.empty()) {
      if (std::optional<ReferenceTable> t =
              read_reference(world, file, key, part.index->samples(), why)) {
        *part.table = std::move(*t);
        log.info("DPO reference ({} pairs): read from {}", part.name, file);
        files[part.name] = file;
        continue;
      }
    }
    if (resumed) {
      throw core::bad_input(
          fmt::format("the DPO reference log-probabilities of the {} pairs are {}: the run "
                      "cannot resume without them (its initial model is {})",
                      part.name, why, model_origin.empty() ? "unknown" : model_origin),
          {.file = file});
    }
    const core::Stopwatch watch;
    // (tensor parallelism: each tensor rank's data world computes the same table)
    *part.table =
        compute_reference(p.data_world(world), *p.model, *part.index, part.loader, key, p.stop);
    if (!file.empty()) {
      write_reference(world, file, *part.table);
      files[part.name] = file;
    }
    log.info(
        "DPO reference ({} pairs): the initial model's log-probabilities of {} pairs, "
        "computed in {:.1f} s ({}){}",
        part.name, part.index->samples(), watch.seconds(), why,
        file.empty() ? "" : fmt::format("; stored in {}", file));
  }
  p.reference_record = {
      {"kind", "precomputed"},
      {"model", model_origin.empty()
                    ? std::string()
                    : std::filesystem::absolute(model_origin).lexically_normal().string()},
      {"model_xxh64", model_xxh64},
      {"mean", mean},
      {"files", files}};
}

}  // namespace

EvalConfig validation_config(const TrainConfig& c) {
  return {.seq_len = c.seq_len,
          .micro_batch = c.micro_batch,
          .margin_from_data = c.margin_from_data,
          .drop_long = c.drop_long,
          .prefetch_depth = c.prefetch_depth,
          .dpo = c.phase == Phase::dpo ? std::optional(c.dpo) : std::nullopt,
          .context_ranks = c.context_parallel};
}

namespace {

// The checkpoint a run resumes, as its model source read it (no value when starting fresh).
struct ResumedCheckpoint {
  std::optional<ckpt::Manifest> manifest;
  std::string step_dir;
};

// The model the run trains: the resumed checkpoint's (either level), --init's, or a preset's
// with fresh weights; a LoRA checkpoint holds adapters, whose frozen model is the base it
// recorded. Checks what the model must be for this run.
ResumedCheckpoint resolve_model(TrainerParts& p, const ResumePoint& resume) {
  const TrainConfig& c = p.config;
  p.source =
      resume.local
          ? checkpoint_model_source(c.model, resume.local->state.manifest, resume.local_origin)
          : resolve_model_source(c.model,
                                 resume.checkpoint_dir.empty() ? c.init : resume.checkpoint_dir);
  ResumedCheckpoint resumed;
  if (resume.resuming()) {
    resumed = {p.source.checkpoint, p.source.step_dir};
    check_lora_resume(*resumed.manifest, resumed.step_dir, c.lora);
    if (resumed.manifest->lora) p.source = resolve_model_source(c.model, resumed.manifest->base);
  }
  if (c.lora.enabled()) {
    p.lora_base = resumed.manifest ? resumed.manifest->base : p.source.origin();
    if (p.lora_base.empty()) {
      throw core::usage_error("--lora-rank needs the model to adapt: --init CKPT|HF_DIR");
    }
    // An absolute path: the checkpoint names its base for runs started anywhere.
    p.lora_base = std::filesystem::absolute(p.lora_base).lexically_normal().string();
  }
  if (c.seq_len > p.source.config.max_position_embeddings) {
    throw core::usage_error(fmt::format("--seq-len {} is longer than the model's {} positions",
                                        c.seq_len, p.source.config.max_position_embeddings));
  }
  if (c.phase != Phase::reward && p.source.initial_head() == model::HeadKind::reward) {
    throw core::usage_error(fmt::format("--init {} is a reward model; {} needs a language model",
                                        p.source.origin(), c.phase == Phase::sft ? "SFT" : "DPO"));
  }
  if (resumed.manifest) {
    ckpt::check_resume_compatible(
        *resumed.manifest,
        {.phase = c.phase, .config = c.to_json(), .allow_config_change = c.allow_config_change},
        resumed.step_dir);
  }
  return resumed;
}

// The weights that train, before a resumed run restores its own: the model's (each rank its
// pieces with ZeRO-3: no rank ever holds the whole model), or LoRA's adapters (fresh, or
// --init-adapter's) over the frozen base `base` (empty when sharded). Returns the initial
// model's digest where DPO's reference is that model (full fine-tuning, a fresh run). Collective.
std::string initialize_trained_weights(const dist::World& world, const core::Logger& log,
                                       TrainerParts& p, const ResumedCheckpoint& resumed,
                                       const std::vector<float>& base) {
  const TrainConfig& c = p.config;
  const model::ParameterLayout& layout = p.model->layout();
  // The initial model is DPO's reference, and GRPO's with --beta > 0: its digest identifies it.
  const bool dpo = c.phase == Phase::dpo || (c.phase == Phase::grpo && c.grpo.beta > 0);
  parallel::ShardedOptimizer& optimizer = p.parallel->optimizer();
  if (c.lora.enabled()) {
    // The frozen model is identified by its digest (read once more, by the ranks in turn, when
    // it is sharded); a resumed run's adapters are restored later.
    p.lora_base_xxh64 =
        base.empty() ? base_digest(world, p.source, layout, c.seed) : base_digest(layout, base);
    if (resumed.manifest && resumed.manifest->base_xxh64 != p.lora_base_xxh64) {
      throw core::bad_input(
          fmt::format("the model at {} is not the one these adapters were trained on (its "
                      "weights' digest is {}, the checkpoint's base had {})",
                      p.lora_base, p.lora_base_xxh64,
                      resumed.manifest->base_xxh64.empty()
                          ? "none this version reads (written by an earlier llama3-hpc)"
                          : resumed.manifest->base_xxh64),
          {.file = resumed.step_dir});
    }
    if (resumed.manifest) return {};
    std::vector<float> score;  // a reward model's score head as loaded, when sharded
    if (base.empty() && c.phase == Phase::reward)
      score = initial_tensor(world, p.source, layout, c.seed, "score.weight");
    const std::vector<float> adapters = starting_adapters(world, log, c, *p.model, score);
    p.model->load_adapters(adapters);
    if (p.placement.master_in_optimizer) optimizer.load_master_from_whole(adapters);
    return {};
  }
  if (resumed.manifest) return {};
  if (p.tensor_map) {
    // Tensor parallelism: this rank's slice of the whole model's initial weights, read as pieces
    // of the whole layout (random ones drawn at their whole positions): one rank's model.
    const bool sharded = p.placement.shards_trained_weights();
    const std::vector<model::FlatRange> mine =
        sharded ? optimizer.state_ranges() : std::vector<model::FlatRange>{{0, layout.total()}};
    const std::vector<model::SliceRun> pieces = p.tensor_map->pieces(mine, false);
    const std::vector<float> values = p.tensor_map->scatter_values(
        mine, pieces,
        initial_weights_of_ranges(world, p.tensor_map->whole(), p.source, c.seed,
                                  parallel::TensorStateMap::whole_ranges(pieces)));
    if (sharded) {
      optimizer.load_master(mine, values);
      p.parallel->gather_parameters();
    } else {
      p.model->load_parameters(values);
      if (p.placement.master_in_optimizer) optimizer.load_master_from_whole(values);
    }
    return dpo ? base_digest(world, p.source, p.tensor_map->whole(), c.seed) : std::string();
  }
  if (p.placement.shards_trained_weights()) {
    const std::vector<model::FlatRange> mine = optimizer.state_ranges();
    optimizer.load_master(mine, initial_weights_of_ranges(world, layout, p.source, c.seed, mine));
    p.parallel->gather_parameters();
    // DPO: the initial model is the reference (read once more, by the ranks in turn).
    return dpo ? base_digest(world, p.source, layout, c.seed) : std::string();
  }
  const std::vector<float> initial = initialize_model(world, *p.model, p.source, c.seed);
  if (p.placement.master_in_optimizer) optimizer.load_master_from_whole(initial);
  // DPO: the initial model is the reference; its digest identifies the reference's table.
  return dpo ? base_digest(layout, initial) : std::string();
}

// The model (model_assembly.hpp), the data-parallel optimizer over what trains, and the initial
// weights. Returns initialize_trained_weights's digest. Collective.
std::string build_training_model(const dist::World& world, const core::Logger& log, TrainerParts& p,
                                 const ResumedCheckpoint& resumed) {
  const TrainConfig& c = p.config;
  const ModelRecipe recipe{
      .purpose = ModelPurpose::train,
      .head = c.phase == Phase::reward ? model::HeadKind::reward : model::HeadKind::language_model,
      .placement = p.placement,
      .recompute = c.recompute,
      .lora = c.lora,
      .seed = c.seed,
      .tensor = {.rank = world.rank() % p.placement.tensor_parallel,
                 .ranks = p.placement.tensor_parallel}};
  AssembledModel assembled = build_model(*p.ops, p.source.config, recipe);
  std::vector<float> base;  // LoRA's frozen model, when held whole
  if (c.lora.enabled()) base = load_frozen_weights(&world, *p.ops, p.source, recipe, assembled);
  p.frozen = std::move(assembled.frozen);
  p.model = std::move(assembled.model);
  if (p.context) p.model->set_context_exchange(p.context.get());
  parallel::DataParallelConfig dp = data_parallel_config(c, p.placement);
  if (p.tensor) {
    p.model->set_tensor_exchange(p.tensor.get());
    p.tensor_map = std::make_unique<parallel::TensorStateMap>(
        model::ParameterLayout(p.source.config, recipe.head), p.model->layout(),
        p.model->tensor_slice());
    dp.tensor = p.tensor.get();
    if (p.tensor->rank() != 0) dp.counted_by_tensor_rank_0 = p.tensor_map->replicated();
  }
  // What trains: the model's weights, or with LoRA the adapters (and a reward model's score).
  const parallel::ModelWeights weights =
      p.placement.master_in_optimizer
          ? parallel::ModelWeights{.master = {}, .compute = p.model->trainable_parameters()}
          : parallel::ModelWeights{.master = p.model->master_weights(),
                                   .compute = p.model->weight_copy()};
  p.parallel = std::make_unique<parallel::DataParallel>(
      p.data_world(world), *p.ops, p.model->trainable_layout(), dp, c.adamw, weights);
  attach_parallel(*p.model, *p.parallel);
  return initialize_trained_weights(world, log, p, resumed, base);
}

// A resumed run's state (the node-local level's, or --ckpt-dir's when those states do not fit
// this run's partition of the optimizer state), and the checkpoints the run writes. Collective.
void restore_and_plan_checkpoints(const dist::World& world, const core::Logger& log,
                                  TrainerParts& p, ResumePoint& resume,
                                  std::optional<LocalLevel> level) {
  const TrainConfig& c = p.config;
  if (resume.local) {
    p.resumed_from = resume.local_origin;
    p.resumed =
        restore_local_state(world, log, resume.local->state, resume.local_origin, *p.parallel);
    if (!p.resumed) {
      resume.fall_back_to_checkpoint();
      log.warn(
          "the node-local level's states do not fit this run's partition of the optimizer "
          "state (other sharding or --bucket-mb): resuming from {} instead",
          resume.checkpoint_dir);
    }
  }
  if (resume.level == ResumePoint::Level::checkpoint) {
    p.resumed_from = resume.checkpoint_dir;
    p.resumed = restore_checkpoint(world, log, resume.checkpoint_dir, *resume.checkpoint_manifest,
                                   *p.parallel, p.model->trainable_layout(), p.tensor_map.get());
  }
  if (p.resumed) p.ops->synchronize();
  p.progress = std::make_unique<ProgressBar>(c.progress, world.is_root());
  p.checkpoints = std::make_unique<RunCheckpoints>(
      world, log, *p.progress, c.ckpt_dir,
      ckpt::WriterPolicy{.keep_last = c.keep_last, .async = !c.checkpoint_sync}, *p.parallel,
      std::move(level), p.tensor_map.get());
  if (!resume.checkpoint_dir.empty())
    p.checkpoints->resumed_from(resume.checkpoint_dir, resume.checkpoint_step());
  if (resume.local) {
    p.checkpoints->resumed_from_local(resume.local->step);
    // States that came from other nodes: the level is written again at once, so that it
    // survives the next lost node as well as the last one.
    p.reprotect_local = resume.local->rebuilt;
  }
}

data::LoaderConfig training_loader(const dist::World& world, const TrainerParts& p) {
  const TrainConfig& c = p.config;
  data::LoaderConfig lc;
  lc.plan.seq_len = c.seq_len;
  lc.plan.global_batch = c.global_batch;
  lc.plan.micro_batch = c.micro_batch;
  lc.plan.world_size = world.size() / c.context_parallel;  // the data-parallel groups
  lc.context_ranks = c.context_parallel;
  lc.plan.seed = c.seed;
  lc.plan.long_samples = c.drop_long ? data::LongSamples::drop : data::LongSamples::truncate;
  lc.depth = c.prefetch_depth;
  lc.pad_id = pad_token(c.data_from_host ? p.source.config.vocab_size : p.index.vocab_size);
  lc.model_vocab = p.source.config.vocab_size;
  lc.margins_from_data = c.margin_from_data;
  if (c.margin_from_data && !c.data_from_host && !p.index.has_margin()) {
    throw core::usage_error(fmt::format(
        "--margin-from-data: the dataset {} has no margins (its records had no \"margin\")",
        c.data));
  }
  lc.reader.response_masks = c.phase == Phase::dpo;
  return lc;
}

// GRPO's reference with --beta > 0 (the policy the KL is measured against): LoRA's base, the
// trained model without its adapters; with full fine-tuning a frozen copy of the initial model
// (whole on every rank, or sharded over them with --shard-parameters), identified in every
// checkpoint by its digest. A resumed run loads the model its checkpoint names and checks its
// digest. Collective.
grpo::ReferencePolicy prepare_grpo_reference(const dist::World& world, const core::Logger& log,
                                             TrainerParts& p,
                                             const std::optional<ckpt::Manifest>& resumed,
                                             const std::string& initial_digest) {
  const TrainConfig& c = p.config;
  if (c.grpo.beta <= 0) return {};
  if (c.lora.enabled()) {
    p.reference_record = base_model_reference(p);
    log.info(
        "GRPO reference: the base model without the adapters (a forward pass more per "
        "micro-batch of a generation batch, no second copy of the weights)");
    return {.model = p.model.get(), .adapters = false};
  }
  ModelSource source = p.source;
  std::string origin = p.source.origin();
  std::string digest = initial_digest;
  if (resumed) {
    origin = resumed->reference.value("model", "");
    digest = resumed->reference.value("model_xxh64", "");
    if (digest.empty()) {
      throw core::bad_input("the checkpoint records no GRPO reference (\"reference\")",
                            {.file = p.source.step_dir});
    }
    // Empty: the run started from random weights (--model and --seed).
    source = resolve_model_source(c.model, origin);
  }
  if (!origin.empty()) origin = std::filesystem::absolute(origin).lexically_normal().string();
  const ModelRecipe recipe{.purpose = ModelPurpose::evaluate,
                           .head = model::HeadKind::language_model,
                           .placement = model::Placement::frozen(c.shard_parameters, world.size()),
                           .recompute = true,  // forward passes only
                           .seed = c.seed};
  p.grpo_reference = build_model(*p.ops, source.config, recipe);
  const std::vector<float> weights =
      load_frozen_weights(&world, *p.ops, source, recipe, p.grpo_reference);
  if (resumed) {
    const model::ParameterLayout& layout = p.grpo_reference.model->layout();
    const std::string loaded =
        weights.empty() ? base_digest(world, source, layout, c.seed) : base_digest(layout, weights);
    if (loaded != digest) {
      throw core::bad_input(
          fmt::format("the model at {} is not this run's GRPO reference (its weights' digest is "
                      "{}, the checkpoint's reference had {})",
                      origin.empty() ? std::string("(random, --model and --seed)") : origin, loaded,
                      digest),
          {.file = p.source.step_dir});
    }
  }
  p.reference_record = {{"kind", "initial model"}, {"model", origin}, {"model_xxh64", digest}};
  log.info("GRPO reference: a frozen copy of the initial model {}{}",
           origin.empty() ? std::string("(random weights)") : origin,
           c.shard_parameters ? ", sharded over the ranks" : "");
  return {.model = p.grpo_reference.model.get(), .adapters = true};
}

// The data from where the run continues: the host's source or config.data's shards (after
// DPO's reference, which reads them too), and the steps it gives. Collective.
void start_data(const dist::World& world, const core::Logger& log, TrainerParts& p,
                std::unique_ptr<StepSource> data, const ResumedCheckpoint& resumed,
                const std::string& initial_digest) {
  const TrainConfig& c = p.config;
  // A tensor-parallel group's ranks read the same data: the data's world is the tensor rank's.
  const dist::World& dw = p.data_world(world);
  data::LoaderConfig lc = training_loader(dw, p);
  if (c.phase == Phase::dpo) {
    if (data) {
      throw core::usage_error(
          "dpo reads its pairs from --data shards (a host DataSource gives no response masks)");
    }
    prepare_dpo_reference(world, log, p, lc, resumed.manifest, initial_digest);
  }
  if (c.phase == Phase::grpo) {
    // Online RL: the steps are made by the model being trained (grpo/rollout_source.hpp).
    const grpo::ReferencePolicy reference =
        prepare_grpo_reference(world, log, p, resumed.manifest, initial_digest);
    p.data = std::make_unique<grpo::RolloutSource>(
        world, log, *p.model, reference, grpo::PromptSet::load(world, p.index),
        c.val_data.empty() ? grpo::PromptSet() : grpo::PromptSet::load(world, p.val_index),
        grpo::RolloutConfig{
            .settings = c.grpo,
            .seed = c.seed,
            .prompts_per_step = c.global_batch,
            .micro_batch = c.micro_batch,
            .seq_len = c.seq_len,
            .shard_parameters = c.shard_parameters,
            .tokenizer = c.tokenizer.empty() ? p.index.tokenizer_name : c.tokenizer,
            .cache_dir = c.ckpt_dir.empty()
                             ? std::string()
                             : (std::filesystem::path(c.ckpt_dir) / "rollouts").string(),
            .stop = p.stop,
            .link = p.link,
            .generate = false,
            .trained_weights =
                [&p] {
                  // This rank's pieces of the fp32 master weights, whatever the ZeRO stage.
                  grpo::WeightPieces w;
                  w.ranges = p.parallel->write_ranges();
                  std::int64_t n = 0;
                  for (const model::FlatRange& r : w.ranges) n += r.size();
                  w.values.resize(static_cast<std::size_t>(n));
                  p.parallel->optimizer().save_master(w.ranges, w.values);
                  return w;
                },
            .frozen_base =
                [&p, &world] {
                  // LoRA: this rank's pieces of the frozen weights: its share with
                  // --shard-parameters, else the whole of them on rank 0 and none elsewhere.
                  grpo::WeightPieces base;
                  if (p.frozen) {
                    parallel::ShardedWeights::HostPieces mine = p.frozen->host_pieces(*p.ops);
                    base.ranges = std::move(mine.ranges);
                    base.values = std::move(mine.values);
                    return base;
                  }
                  if (!world.is_root()) return base;
                  base.ranges = {{0, p.model->layout().total()}};
                  base.values.resize(static_cast<std::size_t>(p.model->layout().total()));
                  p.ops->copy(kernels::TensorView(std::span<float>(base.values)),
                              p.model->parameters());
                  p.ops->synchronize();
                  return base;
                },
            // What the generating ranks' model computes with: fp32 keeps every bit on the CPU,
            // bf16 (rounded as the device rounds) halves the bytes on CUDA.
            .weights_wire = p.ops->compute_dtype() == kernels::DType::bf16 ? grpo::WireType::bf16
                                                                           : grpo::WireType::f32});
  } else {
    p.data = data ? std::move(data) : std::make_unique<ShardStepSource>(dw, p.index, lc);
    lc.plan.validate();  // --global-batch a multiple of ranks x --micro-batch, for any source
  }
  p.data->start(StepShape{.phase = c.phase,
                          .seq_len = c.seq_len,
                          .per_rank = c.global_batch / (dw.size() / c.context_parallel),
                          .micro_batch = c.micro_batch,
                          .pad_id = lc.pad_id,
                          .vocab_size = p.source.config.vocab_size,
                          .margins_from_data = c.margin_from_data,
                          .rank = dw.rank() / c.context_parallel,
                          .ranks = dw.size() / c.context_parallel,
                          .resumed_at = p.resumed ? std::optional<std::int64_t>(p.resumed->step)
                                                  : std::nullopt},
                p.resumed ? p.resumed->position : data::Position{0, 0});
  p.total_steps = count_steps(c, *p.data);
  p.data->set_total_steps(p.total_steps);
  log_plan(world, log, p);
}

}  // namespace

std::unique_ptr<TrainerParts> assemble_trainer(const dist::World& world, const core::Logger& log,
                                               TrainConfig config, std::unique_ptr<StepSource> data,
                                               const std::atomic<bool>* stop,
                                               const grpo::GenerationLink* link) {
  // In place, never moved: the data source holds a reference to `index`.
  auto parts = std::make_unique<TrainerParts>();
  TrainerParts& p = *parts;
  p.stop = stop;
  p.link = link;
  p.config = std::move(config);
  const TrainConfig& c = p.config;
  c.validate();
  for (const std::string& warning : c.warnings) log.warn("{}", warning);
  if (c.data_from_host != (data != nullptr))
    throw core::internal_error("Trainer: data_from_host and the data source disagree");
  p.ops = kernels::make_ops(
      c.backend, world.local_rank(),
      {.device = c.device, .attention = c.attention, .deterministic = c.deterministic});
  p.placement = parallel::choose_placement(c, world.size(), p.ops->compute_dtype());
  // (Planned for any backend by --dry-run-memory; run on the CPU's.)
  if (p.placement.context_parallel > 1 && p.ops->backend() != kernels::Backend::cpu) {
    throw core::usage_error(
        "--context-parallel: the CPU backend only so far (the CUDA attention takes no query "
        "rows yet)");
  }
  if (p.placement.tensor_parallel > 1) {
    if (p.ops->backend() != kernels::Backend::cpu) {
      throw core::usage_error(
          "--tensor-parallel: the CPU backend only so far (the CUDA kernels take no vocabulary "
          "slices yet)");
    }
    p.tensor = std::make_unique<parallel::TensorGroup>(world, p.placement.tensor_parallel);
    p.tensor_rank_world = world.split(world.rank() % p.placement.tensor_parallel, world.rank());
  }
  if (p.placement.context_parallel > 1) {
    p.context =
        std::make_unique<parallel::ContextGroup>(p.data_world(world), p.placement.context_parallel);
  }
  if (p.ops->backend() == kernels::Backend::cuda && world.is_root()) {
    // Which attention runs and whether its backward keeps reruns and restarts bit-identical.
    const kernels::AttentionChoice attention =
        kernels::attention_choice(c.attention, c.deterministic, world.local_rank(), c.device);
    const std::string line = kernels::describe_attention(c.attention, attention);
    if (attention.cudnn && !attention.deterministic_backward) {
      log.warn("{}", line);
    } else {
      log.info("{}", line);
    }
  }
  if (c.device >= 0 && p.ops->backend() == kernels::Backend::cpu && world.is_root()) {
    log.warn("--device {} names a CUDA device; the CPU backend runs on the host and ignores it",
             c.device);
  }
  if (c.eval_every > 0 && c.val_data.empty() && world.is_root()) {
    log.warn(
        "--eval-every {} without --val-data: nothing is evaluated (name a validation set, "
        "for example prep's val/ split, to have it)",
        c.eval_every);
  }
  if (c.eval_on_start && c.val_data.empty() && world.is_root())
    log.warn("--eval-on-start without --val-data: nothing is evaluated");
  check_outputs_writable(world, c);
  stop_if_requested(world, stop, "while starting");

  // Where the run continues from (the newer of the node-local level and --ckpt-dir), and the
  // model it trains.
  p.run_key = run_key(world, c);
  std::optional<LocalLevel> level = plan_local_level(world, log, c, p.run_key);
  ResumePoint resume = choose_resume_point(world, log, c, level);
  stop_if_requested(world, stop, "after choosing where to resume from");
  const ResumedCheckpoint resumed = resolve_model(p, resume);
  const model::ModelConfig& mc = p.source.config;
  if (!c.data_from_host)
    p.index = open_data(world, c.data, c.phase, mc, p.source, c.ignore_tokenizer_mismatch);
  if (!c.val_data.empty())
    p.val_index = open_data(world, c.val_data, c.phase, mc, p.source, c.ignore_tokenizer_mismatch);
  require_training_memory(world, *p.ops, c, mc);

  const std::string initial_digest = build_training_model(world, log, p, resumed);
  restore_and_plan_checkpoints(world, log, p, resume, std::move(level));
  p.run_id = p.resumed && !p.resumed->run_id.empty() ? p.resumed->run_id : new_run_id(world);
  stop_if_requested(world, stop, "after loading the model");

  start_data(world, log, p, std::move(data), resumed, initial_digest);
  p.schedule = {c.lr, c.min_lr < 0 ? 0.1 * c.lr : c.min_lr, c.warmup, p.total_steps};
  p.peak_tflops = c.peak_tflops > 0
                      ? c.peak_tflops
                      : kernels::default_peak_tflops(p.ops->backend(), world.local_rank());
  open_metrics_sinks(world, log, p);
  p.objective = make_objective(c.phase, *p.model,
                               {.center_rewards = c.center_rewards,
                                .dpo = c.dpo,
                                .reference = p.reference.empty() ? nullptr : &p.reference,
                                .grpo = &c.grpo});
  stop_if_requested(world, stop, "while starting");
  return parts;
}

}  // namespace l3::train
