// Evaluation of a model on a whole dataset, split over the ranks: SFT loss and perplexity
// (token-weighted over every loss token), or reward accuracy, mean margin and the mean and
// standard deviation of the rewards (chosen and rejected alike) over every pair.
#pragma once

#include <cstdint>

#include "dist/world.hpp"
#include "io/data/data_loader.hpp"
#include "io/data/dataset_index.hpp"
#include "model/llama_model.hpp"
#include "train/dpo_reference.hpp"
#include "train/metrics.hpp"

namespace l3::train {

struct EvalConfig {
  std::int64_t seq_len = 2048;
  std::int64_t micro_batch = 1;  // rows (SFT) or pairs (reward) per rank and pass
  bool margin_from_data = false;
  bool drop_long = false;  // SFT: samples longer than seq_len are dropped (else truncated)
  int prefetch_depth = 2;
  // DPO (a language model on preference data): the loss, and the reference's log-probabilities
  // of the dataset's pairs (computed over this evaluation's batches: evaluation_loader), or
  // null with LoRA (the model without its adapters is the reference).
  std::optional<model::DpoSettings> dpo;
  const ReferenceTable* reference = nullptr;
  // Context parallelism: groups of this many consecutive ranks share each batch's rows.
  int context_ranks = 1;
};

// The data plan of an evaluation (every pair once, split over the ranks).
[[nodiscard]] data::LoaderConfig evaluation_loader(const dist::World& world,
                                                   const model::LlamaModel& model,
                                                   const data::DatasetIndex& index,
                                                   const EvalConfig& config);

// Collective over `world`. The phase follows from the dataset's kind and config.dpo (it must
// suit the model's head: the caller checks).
[[nodiscard]] EvalMetrics evaluate(const dist::World& world, model::LlamaModel& model,
                                   const data::DatasetIndex& index, const EvalConfig& config);

}  // namespace l3::train
