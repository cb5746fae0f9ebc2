#include "io/data/epoch_plan.hpp"

#include <fmt/format.h>

#include <deque>
#include <numeric>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace l3::data {

void PlanConfig::validate() const {
  if (seq_len <= 0) throw core::usage_error("--seq-len must be positive");
  if (global_batch <= 0 || micro_batch <= 0)
    throw core::usage_error("--global-batch and --micro-batch must be positive");
  const std::int64_t per_pass = static_cast<std::int64_t>(world_size) * micro_batch;
  if (global_batch % per_pass != 0) {
    throw core::usage_error(
        fmt::format("--global-batch {} must be a multiple of ranks {} x --micro-batch {} = {}",
                    global_batch, world_size, micro_batch, per_pass));
  }
}

std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed,
                                            std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  const core::CounterRng rng(seed, core::RngPurpose::data_order, static_cast<std::uint32_t>(epoch));
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(
        rng.below(static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i + 1)));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

EpochPlan EpochPlan::build(const DatasetIndex& index, const PlanConfig& config,
                           std::int64_t epoch) {
  config.validate();
  EpochPlan plan;
  plan.config_ = config;
  plan.kind_ = index.kind;
  plan.epoch_ = epoch;
  const std::vector<std::int64_t> order = epoch_permutation(index.samples(), config.seed, epoch);

  if (index.kind == SampleKind::preference) {
    for (const std::int64_t s : order) {
      if (index.sample_tokens(s) > config.seq_len) {
        ++plan.skipped_;
      } else {
        plan.pairs_.push_back(s);
      }
    }
    const auto pairs = static_cast<std::int64_t>(plan.pairs_.size());
    plan.steps_ = (pairs + config.global_batch - 1) / config.global_batch;
    return plan;
  }

  // First fit among a window of open rows; a row leaves the window when full or pushed out.
  struct OpenRow {
    std::int64_t row;
    std::int64_t used;
  };
  std::vector<std::vector<std::int64_t>> rows;
  std::deque<OpenRow> open;
  for (const std::int64_t s : order) {
    std::int64_t length = index.sample_tokens(s);
    if (length > config.seq_len) {
      if (config.long_samples == LongSamples::drop) {
        ++plan.skipped_;
        continue;
      }
      ++plan.truncated_;
      length = config.seq_len;
    }
    bool placed = false;
    for (OpenRow& o : open) {
      if (o.used + length <= config.seq_len) {
        rows[static_cast<std::size_t>(o.row)].push_back(s);
        o.used += length;
        placed = true;
        break;
      }
    }
    if (!placed) {
      rows.push_back({s});
      open.push_back({static_cast<std::int64_t>(rows.size()) - 1, length});
      if (static_cast<int>(open.size()) > config.window) open.pop_front();
    }
    std::erase_if(open, [&](const OpenRow& o) { return o.used == config.seq_len; });
  }
  plan.row_begin_.push_back(0);
  for (const auto& row : rows) {
    plan.row_samples_.insert(plan.row_samples_.end(), row.begin(), row.end());
    plan.row_begin_.push_back(static_cast<std::int64_t>(plan.row_samples_.size()));
  }
  const auto row_count = static_cast<std::int64_t>(rows.size());
  plan.steps_ = (row_count + config.global_batch - 1) / config.global_batch;
  return plan;
}

std::vector<std::vector<std::int64_t>> EpochPlan::micro_batch(std::int64_t step, int rank,
                                                              std::int64_t micro) const {
  const std::int64_t per_rank = config_.global_batch / config_.world_size;
  const std::int64_t first =
      step * config_.global_batch + rank * per_rank + micro * config_.micro_batch;
  std::vector<std::vector<std::int64_t>> units;
  units.reserve(static_cast<std::size_t>(config_.micro_batch));
  if (kind_ == SampleKind::preference) {
    for (std::int64_t i = first; i < first + config_.micro_batch; ++i) {
      if (i < static_cast<std::int64_t>(pairs_.size()))
        units.push_back({pairs_[static_cast<std::size_t>(i)]});
    }
    return units;
  }
  const auto rows = static_cast<std::int64_t>(row_begin_.size()) - 1;
  for (std::int64_t r = first; r < first + config_.micro_batch; ++r) {
    if (r >= rows) {
      units.emplace_back();  // the epoch's last step: an empty row keeps the shapes
      continue;
    }
    units.emplace_back(row_samples_.begin() + row_begin_[static_cast<std::size_t>(r)],
                       row_samples_.begin() + row_begin_[static_cast<std::size_t>(r) + 1]);
  }
  return units;
}

std::vector<std::int64_t> EpochPlan::all_samples() const {
  return kind_ == SampleKind::preference ? pairs_ : row_samples_;
}

}  // namespace l3::data
