#include "train/evaluator.hpp"

#include <mpi.h>

#include <array>
#include <cmath>

#include "core/timer.hpp"
#include "dist/communicator.hpp"
#include "io/data/data_loader.hpp"
#include "io/tokenizer/special_tokens.hpp"

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
  loader_config.plan.global_batch = config.micro_batch * world.size();
  loader_config.plan.world_size = world.size();
  loader_config.plan.seed = 0;  // the order does not change token-weighted sums
  loader_config.plan.long_samples =
      config.drop_long ? data::LongSamples::drop : data::LongSamples::truncate;
  loader_config.depth = config.prefetch_depth;
  loader_config.pad_id = pad_token(index);
  loader_config.model_vocab = model.config().vocab_size;
  loader_config.margins_from_data = config.margin_from_data;
  loader_config.reader.response_masks = config.dpo.has_value();
  return loader_config;
}

EvalMetrics evaluate(const dist::World& world, model::LlamaModel& model,
                     const data::DatasetIndex& index, const EvalConfig& config) {
  const core::Stopwatch watch;
  const bool sft = index.kind == data::SampleKind::sft;
  const bool dpo = !sft && config.dpo.has_value();
  data::DataLoader loader(world, index, evaluation_loader(world, model, index, config), {0, 0});
  const std::int64_t steps = loader.steps_in_epoch(0);

  // Local sums: loss, tokens | pairs, correct, margin, reward sum, reward sum of squares.
  std::array<double, 7> sums{};
  // SFT losses add up in backend memory and are read once, after the last batch.
  model.zero_eval_sums();  // SFT and DPO
  for (std::int64_t s = 0; s < steps; ++s) {
    const data::StepData& step = loader.next();
    for (const model::Batch& batch : step.micro) {
      if (sft ? batch.document_tokens == 0 : batch.pairs() == 0) {
        // ZeRO-3: the other ranks' gathers need this rank
        if (dpo) {
          model.idle_dpo_pass(false, config.reference == nullptr);
        } else {
          model.idle_pass(false);
        }
        continue;
      }
      if (sft) {
        model.sft_eval_accumulate(batch);
        sums[1] += static_cast<double>(batch.counted_tokens());
      } else if (dpo) {
        model.dpo_eval_accumulate(
            batch, *config.dpo,
            config.reference != nullptr ? config.reference->of(batch) : std::vector<double>{});
        sums[2] += static_cast<double>(batch.pairs());
      } else {
        const model::RewardOutput out = model.reward_forward(batch, 0.0);
        sums[0] += out.stats.loss;
        sums[2] += static_cast<double>(out.stats.pairs);
        sums[3] += static_cast<double>(out.stats.correct);
        sums[4] += out.stats.margin;
        for (const auto* scores : {&out.chosen, &out.rejected}) {
          for (const float r : *scores) {
            sums[5] += r;
            sums[6] += static_cast<double>(r) * r;
          }
        }
      }
    }
  }
  std::array<double, 2> rewards{};  // DPO: chosen, rejected rewards
  if (sft) sums[0] = model.eval_sums().loss;
  if (dpo) {
    const model::LossSums s = model.eval_sums();
    sums[0] = s.loss;
    sums[3] = s.correct;
    sums[4] = s.margin;
    rewards = {s.chosen, s.chosen - s.margin};
    dist::check_mpi(
        MPI_Allreduce(MPI_IN_PLACE, rewards.data(), 2, MPI_DOUBLE, MPI_SUM, world.comm()),
        "MPI_Allreduce (evaluation rewards)");
  }
  dist::check_mpi(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()),
                                MPI_DOUBLE, MPI_SUM, world.comm()),
                  "MPI_Allreduce (evaluation)");
  EvalMetrics m;
  m.phase = sft ? Phase::sft : dpo ? Phase::dpo : Phase::reward;
  m.skipped_samples = loader.skipped_in_epoch(0);
  if (sft) {
    m.tokens = static_cast<std::int64_t>(sums[1]);
    m.loss = m.tokens > 0 ? sums[0] / sums[1] : std::nan("");
    m.perplexity = std::exp(m.loss);
  } else {
    m.pairs = static_cast<std::int64_t>(sums[2]);
    const double pairs = std::max(1.0, sums[2]);
    m.loss = sums[0] / pairs;
    m.accuracy = sums[3] / pairs;
    m.margin = sums[4] / pairs;
    m.chosen_reward = rewards[0] / pairs;
    m.rejected_reward = rewards[1] / pairs;
    const double scores = 2.0 * pairs;
    m.reward_mean = sums[5] / scores;
    m.reward_std = std::sqrt(std::max(0.0, sums[6] / scores - m.reward_mean * m.reward_mean));
  }
  m.seconds = watch.seconds();
  return m;
}

}  // namespace l3::train
