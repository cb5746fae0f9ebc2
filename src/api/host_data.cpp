#include "api/host_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "core/timer.hpp"
#include "model/batch.hpp"

namespace l3::api {

namespace {

class HostStepSource final : public train::StepSource {
 public:
  explicit HostStepSource(std::shared_ptr<DataSource> source) : source_(std::move(source)) {}

  void start(const train::StepShape& shape, data::Position from) override {
    shape_ = shape;
    next_ = from;
  }

  const data::StepData& next() override {
    const core::Stopwatch watch;
    StepSamples samples;
    source_->fill(next_.step, shape_.rank, shape_.ranks, samples);
    wait_ms_ = watch.milliseconds();
    step_.position = next_;
    step_.next = {next_.epoch, next_.step + 1};
    step_.micro.clear();
    if (shape_.phase == train::Phase::sft) {
      pack_documents(samples);
    } else {
      pack_pairs(samples);
    }
    step_.assemble_seconds = watch.seconds();
    next_ = step_.next;
    return step_;
  }

  [[nodiscard]] double last_wait_ms() const override { return wait_ms_; }
  // The host's data has no epochs: a run fed by it counts --steps.
  [[nodiscard]] std::optional<std::int64_t> steps_in_epoch(std::int64_t /*epoch*/) const override {
    return std::nullopt;
  }

 private:
  [[nodiscard]] std::int64_t micro_batches() const { return shape_.per_rank / shape_.micro_batch; }

  [[nodiscard]] std::string where() const {
    return fmt::format("DataSource, step {} on rank {}", step_.position.step, shape_.rank);
  }

  void check_tokens(const std::vector<std::int32_t>& tokens, const char* what) const {
    if (tokens.empty()) throw core::bad_input(fmt::format("{}: an empty {}", where(), what));
    if (static_cast<std::int64_t>(tokens.size()) > shape_.seq_len) {
      throw core::bad_input(fmt::format("{}: a {} of {} tokens is longer than --seq-len {}",
                                        where(), what, tokens.size(), shape_.seq_len));
    }
    for (const std::int32_t id : tokens) {
      if (id < 0 || id >= shape_.vocab_size) {
        throw core::bad_input(
            fmt::format("{}: token id {} in a {} is outside the model's "
                        "vocabulary of {}",
                        where(), id, what, shape_.vocab_size));
      }
    }
  }

  // Documents in order into rows of seq_len, micro_batch rows per micro-batch, at most
  // per_rank rows in all (a step with fewer is fine: the loss is normalised globally).
  void pack_documents(const StepSamples& samples) {
    if (!samples.pairs.empty())
      throw core::bad_input(fmt::format("{}: preference pairs in an SFT run", where()));
    step_.samples = static_cast<std::int64_t>(samples.documents.size());
    model::BatchBuilder builder(shape_.micro_batch, shape_.seq_len, shape_.pad_id);
    for (const SftDocument& document : samples.documents) {
      check_tokens(document.tokens, "document");
      if (document.loss_mask.size() != document.tokens.size()) {
        throw core::bad_input(fmt::format("{}: a document of {} tokens with a loss mask of {}",
                                          where(), document.tokens.size(),
                                          document.loss_mask.size()));
      }
      if (builder.add(document.tokens, document.loss_mask) >= 0) continue;
      step_.micro.push_back(builder.finish());
      builder = model::BatchBuilder(shape_.micro_batch, shape_.seq_len, shape_.pad_id);
      (void)builder.add(document.tokens, document.loss_mask);  // fits: a row is empty
    }
    step_.micro.push_back(builder.finish());
    if (static_cast<std::int64_t>(step_.micro.size()) > micro_batches()) {
      throw core::bad_input(fmt::format(
          "{}: the documents fill more than this rank's {} rows of {} tokens (--global-batch / "
          "ranks); give fewer per step",
          where(), shape_.per_rank, shape_.seq_len));
    }
    pad_micro_batches();
  }

  // Every rank runs the same number of micro-batches (the last one's backward pass starts the
  // gradient reduction), so a step with fewer samples gets empty ones.
  void pad_micro_batches() {
    while (static_cast<std::int64_t>(step_.micro.size()) < micro_batches())
      step_.micro.push_back(model::BatchBuilder(1, shape_.seq_len, shape_.pad_id).finish());
  }

  // micro_batch pairs per micro-batch, each pair's two sequences side by side in a row when
  // they fit (as the shard loader does), at most per_rank pairs in all.
  void pack_pairs(const StepSamples& samples) {
    if (!samples.documents.empty())
      throw core::bad_input(fmt::format("{}: SFT documents in a reward run", where()));
    const auto pairs = static_cast<std::int64_t>(samples.pairs.size());
    if (pairs > shape_.per_rank) {
      throw core::bad_input(
          fmt::format("{}: {} pairs, more than this rank's {} (--global-batch / "
                      "ranks)",
                      where(), pairs, shape_.per_rank));
    }
    step_.samples = pairs;
    for (std::int64_t first = 0; first < pairs; first += shape_.micro_batch) {
      const std::int64_t last = std::min(pairs, first + shape_.micro_batch);
      // Rows these pairs take, as the builder below places them: a pair starts a new row when
      // the current one (not empty) cannot hold both sequences; a sequence that does not fit
      // where it would go starts the next row.
      std::int64_t rows = 1;
      std::int64_t used = 0;
      for (std::int64_t p = first; p < last; ++p) {
        const PreferencePair& pair = samples.pairs[static_cast<std::size_t>(p)];
        check_tokens(pair.chosen, "chosen sequence");
        check_tokens(pair.rejected, "rejected sequence");
        const auto need = static_cast<std::int64_t>(pair.chosen.size() + pair.rejected.size());
        if (used > 0 && shape_.seq_len - used < need) {
          ++rows;
          used = 0;
        }
        for (const std::size_t length : {pair.chosen.size(), pair.rejected.size()}) {
          if (static_cast<std::int64_t>(length) > shape_.seq_len - used) {
            ++rows;
            used = 0;
          }
          used += static_cast<std::int64_t>(length);
        }
      }
      model::BatchBuilder builder(rows, shape_.seq_len, shape_.pad_id);
      for (std::int64_t p = first; p < last; ++p) {
        const PreferencePair& pair = samples.pairs[static_cast<std::size_t>(p)];
        const auto need = static_cast<std::int64_t>(pair.chosen.size() + pair.rejected.size());
        if (builder.row_space() < need && builder.row_space() < shape_.seq_len) builder.end_row();
        if (!builder.add_pair(pair.chosen, pair.rejected,
                              shape_.margins_from_data ? pair.margin : 0.0F)) {
          throw core::bad_input(
              fmt::format("{}: a pair of {} + {} tokens does not fit in rows of --seq-len {}",
                          where(), pair.chosen.size(), pair.rejected.size(), shape_.seq_len));
        }
      }
      step_.micro.push_back(builder.finish());
    }
    pad_micro_batches();
  }

  std::shared_ptr<DataSource> source_;
  train::StepShape shape_;
  data::Position next_;
  data::StepData step_;
  double wait_ms_ = 0;
};

}  // namespace

std::unique_ptr<train::StepSource> host_step_source(std::shared_ptr<DataSource> source) {
  return std::make_unique<HostStepSource>(std::move(source));
}

}  // namespace l3::api
