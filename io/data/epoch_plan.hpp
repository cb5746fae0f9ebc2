// The data order of an epoch and how it becomes steps, as a pure function of
// (seed, epoch, step, world size, global batch, micro batch): every rank computes every rank's
// samples from the index alone, so resuming needs only (epoch, step), and the rows of a global
// step are the same whatever the number of ranks.
//
// SFT: the samples (documents) are shuffled by a permutation keyed by (seed, epoch), then packed
// whole into rows of seq_len, first fit among the last `window` open rows, in that order. A
// step is `global_batch` consecutive rows; rank r takes its contiguous 1/W of them, micro-batch
// m the m-th `micro_batch` rows of those. The epoch's last step is completed with empty rows.
// Reward: the pairs are shuffled; a step is `global_batch` consecutive pairs, divided the same
// way; each micro-batch's pairs are packed into as many rows as they need.
//
// Samples longer than a row (a pair: both sequences together) are truncated to seq_len (SFT,
// policy truncate) or left out of the epoch (policy drop; always for pairs), and counted.
#pragma once

#include <cstdint>
#include <vector>

#include "io/data/dataset_index.hpp"

namespace l3::data {

enum class LongSamples { truncate, drop };

struct PlanConfig {
  std::int64_t seq_len = 0;
  std::int64_t global_batch = 0;  // rows (SFT) or pairs (reward) per optimizer step
  std::int64_t micro_batch = 0;   // per rank and forward/backward pass, same unit
  int world_size = 1;
  std::uint64_t seed = 0;
  LongSamples long_samples = LongSamples::truncate;
  int window = 64;  // open rows first fit looks at

  // Gradient-accumulation passes per step: global_batch / (world_size * micro_batch).
  [[nodiscard]] std::int64_t accumulation() const noexcept {
    return global_batch / (static_cast<std::int64_t>(world_size) * micro_batch);
  }
  // usage Error unless the global batch divides into ranks and micro-batches.
  void validate() const;
};

class EpochPlan {
 public:
  [[nodiscard]] static EpochPlan build(const DatasetIndex& index, const PlanConfig& config,
                                       std::int64_t epoch);

  [[nodiscard]] std::int64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  [[nodiscard]] std::int64_t skipped_samples() const noexcept { return skipped_; }
  [[nodiscard]] std::int64_t truncated_samples() const noexcept { return truncated_; }

  // The units of a micro-batch: SFT, rows as lists of samples (an empty list is an empty row);
  // reward, one-element lists (the pairs). Empty when the epoch has run out (the last step).
  [[nodiscard]] std::vector<std::vector<std::int64_t>> micro_batch(std::int64_t step, int rank,
                                                                   std::int64_t micro) const;
  // Every sample of the epoch, in the order steps consume them (tests).
  [[nodiscard]] std::vector<std::int64_t> all_samples() const;

 private:
  PlanConfig config_;
  SampleKind kind_ = SampleKind::sft;
  std::int64_t epoch_ = 0;
  std::int64_t steps_ = 0;
  std::int64_t skipped_ = 0;
  std::int64_t truncated_ = 0;
  // SFT: rows as [row_begin[r], row_begin[r+1]) of row_samples; reward: the pair order.
  std::vector<std::int64_t> row_begin_;
  std::vector<std::int64_t> row_samples_;
  std::vector<std::int64_t> pairs_;
};

// The permutation of 0..n-1 for (seed, epoch): Fisher-Yates on the counter-based RNG.
[[nodiscard]] std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed,
                                                          std::int64_t epoch);

}  // namespace l3::data
