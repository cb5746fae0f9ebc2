#include "train/evaluator.hpp"

#include <memory>

#include "core/timer.hpp"
#include "dist/collectives.hpp"
#include "io/data/data_loader.hpp"
#include "io/tokenizer/special_tokens.hpp"
#include "train/objectives/objective_registry.hpp"

namespace l3::train {

namespace {

std::int32_t pad_token(const data::DatasetIndex& index) {
  // The specials are the last kSpecialTokenCount ids of every Llama 3 vocabulary.
  return static_cast<std::int32_t>(index.vocab_size - tokenizer::kSpecialTokenCount) +
         static_cast<std::int32_t>(tokenizer::Special::finetune_right_pad);
}

}  // namespace

data::LoaderConfig evaluation_loader(const dist::World& world, const model::LlamaModel& model,
                                     const data::DatasetIndex& index, const EvalConfig& config) {
  data::LoaderConfig loader_config;
  loader_config.plan.seq_len = config.seq_len;
  loader_config.plan.micro_batch = config.micro_batch;
  loader_config.plan.global_batch = config.micro_batch * (world.size() / config.context_ranks);
  loader_config.plan.world_size = world.size() / config.context_ranks;
  loader_config.context_ranks = config.context_ranks;
  loader_config.plan.seed = 0;  // the order does not change token-weighted sums
  loader_config.plan.long_samples =
      config.drop_long ? data::LongSamples::drop : data::LongSamples::truncate;
  loader_config.depth = config.prefetch_depth;
  loader_config.pad_id = pad_token(index);
  loader_config.model_vocab = model.whole_config().vocab_size;
  loader_config.margins_from_data = config.margin_from_data;
  loader_config.reader.response_masks = config.dpo.has_value();
  return loader_config;
}

EvalMetrics evaluate(const dist::World& world, model::LlamaModel& model,
                     const data::DatasetIndex& index, const EvalConfig& config) {
  const core::Stopwatch watch;
  const std::unique_ptr<Objective> objective =
      make_objective(evaluation_phase(index.kind, config.dpo.has_value()), model,
                     {.dpo = config.dpo, .reference = config.reference});
  data::DataLoader loader(world, index, evaluation_loader(world, model, index, config), {0, 0});
  const std::int64_t steps = loader.steps_in_epoch(0);
  objective->begin_eval();
  for (std::int64_t s = 0; s < steps; ++s) {
    const data::StepData& step = loader.next();
    // Every micro-batch, those with nothing for the objective too (ZeRO-3: the other ranks'
    // gathers need this rank).
    for (const model::Batch& batch : step.micro) objective->evaluate(batch);
  }
  EvalTotals totals = objective->eval_totals();
  dist::all_reduce(world.comm(), std::span<double>(totals.values), dist::ReduceOp::sum,
                   "evaluation");
  EvalMetrics m = objective->eval_metrics(totals);
  m.skipped_samples = loader.skipped_in_epoch(0);
  m.seconds = watch.seconds();
  return m;
}

}  // namespace l3::train
