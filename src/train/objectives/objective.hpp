// An objective: what a model is trained for, computed from the backbone's last hidden states.
// It says what a micro-batch counts for (loss tokens, pairs), runs its head's forward and
// backward between LlamaModel::forward() and backward(), and turns what its passes summed into
// a step's and an evaluation's metrics. The trainer's step loop and the evaluator call these
// members only: adding an objective is a class here and a line in objective_registry.cpp.
//
// Every micro-batch a rank runs goes through train() / evaluate(), those with nothing for the
// objective too: they run as a batch of no rows, so that the model's parameter-window and
// gradient-ready calls are those of the other ranks' real passes (LlamaModel::load_batch).
#pragma once

#include <array>
#include <cstdint>

#include "l3/l3.hpp"
#include "model/batch.hpp"
#include "model/llama_model.hpp"

namespace l3::train {

using Phase = l3::Phase;

// What a pass's head adds into a sum slot (LlamaModel::sums), in this order. The trainer sums
// the first kSums values over the ranks and takes the maximum of the last kMaxima (`largest`).
struct LossSums {
  double loss = 0.0;     // summed cross-entropy of counted tokens, or summed pair losses
  double correct = 0.0;  // pairs whose chosen score (DPO: reward) is the higher; GRPO: kl
  double margin = 0.0;   // summed chosen - rejected scores (DPO: rewards); GRPO: low-clipped
  double chosen = 0.0;   // DPO: summed chosen rewards; GRPO: high-clipped tokens
  // An objective's own (GRPO: summed entropy; importance sampling's sum of ratios, its units,
  // its masked or truncated tokens).
  std::array<double, 4> extra{};
  // Maxima (GRPO: the generator's log-probability error; the largest importance-sampling
  // ratio, and 1 / (1 + the smallest)): 0 is the neutral value.
  std::array<double, 3> largest{};

  static constexpr std::size_t kSums = 8;
  static constexpr std::size_t kMaxima = 3;
  static constexpr std::size_t kValues = kSums + kMaxima;
  [[nodiscard]] std::array<double, kValues> values() const noexcept {
    return {loss,     correct,  margin,     chosen,     extra[0],  extra[1],
            extra[2], extra[3], largest[0], largest[1], largest[2]};
  }
  [[nodiscard]] static LossSums of(const std::array<double, kValues>& v) noexcept {
    return {.loss = v[0],
            .correct = v[1],
            .margin = v[2],
            .chosen = v[3],
            .extra = {v[4], v[5], v[6], v[7]},
            .largest = {v[8], v[9], v[10]}};
  }
};
static_assert(LossSums::kValues == model::LlamaModel::kSumValues);

// An evaluation's totals on one rank, summed over the ranks before eval_metrics().
struct EvalTotals {
  static constexpr int kValues = 8;
  // loss, units (tokens or pairs), correct, margin, reward sum and sum of squares (reward
  // models' scores), chosen and rejected rewards (DPO)
  std::array<double, kValues> values{};
  double& loss() { return values[0]; }
  double& units() { return values[1]; }
  double& correct() { return values[2]; }
  double& margin() { return values[3]; }
  double& reward_sum() { return values[4]; }
  double& reward_squares() { return values[5]; }
  double& chosen_reward() { return values[6]; }
  double& rejected_reward() { return values[7]; }
};

class Objective {
 public:
  explicit Objective(model::LlamaModel& model) : model_(model) {}
  virtual ~Objective() = default;
  Objective(const Objective&) = delete;
  Objective& operator=(const Objective&) = delete;
  Objective(Objective&&) = delete;
  Objective& operator=(Objective&&) = delete;

  [[nodiscard]] virtual Phase phase() const noexcept = 0;
  // What a step's loss and gradients are the mean over, a micro-batch's share: its loss
  // tokens, or its pairs.
  [[nodiscard]] virtual std::int64_t units(const model::Batch& batch) const = 0;
  // Whether a micro-batch holds anything for this objective (else it runs with no rows).
  [[nodiscard]] virtual bool has_work(const model::Batch& batch) const = 0;

  // A training step: begin_step(), train() per micro-batch (forward and backward, the
  // gradients of grad_scale * loss added into the model's), then step_sums() once (it waits:
  // the losses add up in backend memory).
  void begin_step() { model_.zero_sums(model::SumSlot::step); }
  void train(const model::Batch& batch, float grad_scale);
  [[nodiscard]] LossSums step_sums() const { return read(model::SumSlot::step); }
  // The step's loss and the objective's other metrics from the sums and units of every rank.
  virtual void describe_step(const LossSums& global, std::int64_t units, StepMetrics& m) const = 0;

  // An evaluation: begin_eval(), evaluate() per batch (forward only), eval_totals() (this
  // rank's), summed over the ranks into eval_metrics().
  void begin_eval();
  void evaluate(const model::Batch& batch);
  [[nodiscard]] virtual EvalTotals eval_totals() const;
  [[nodiscard]] virtual EvalMetrics eval_metrics(const EvalTotals& global) const = 0;

 protected:
  // One micro-batch's pass (the batch has no rows when !has_work), its losses added into
  // `slot`; backward: also the head's backward and the model's, the gradients of
  // grad_scale * loss.
  virtual void pass(const model::Batch& batch, float grad_scale, bool backward,
                    model::SumSlot slot) = 0;
  // An evaluation pass: pass() into the eval slot, the batch's units counted on the host.
  virtual void eval_pass(const model::Batch& batch);
  [[nodiscard]] LossSums read(model::SumSlot slot) const;

  model::LlamaModel& model_;
  EvalTotals host_;  // what evaluation passes count on the host
};

// An objective on preference pairs (reward, DPO): a step is the mean over its pairs, a
// micro-batch without pairs has nothing for it. The shared halves of their metrics: the step's
// loss, accuracy and margin; an evaluation's pairs, loss, accuracy, margin and reward statistics.
class PreferenceObjective : public Objective {
 public:
  using Objective::Objective;
  // A context-parallel group's pairs count once: on its rank 0.
  [[nodiscard]] std::int64_t units(const model::Batch& batch) const override {
    return batch.context_rows.empty() || batch.context_rank == 0 ? batch.pairs() : 0;
  }
  [[nodiscard]] bool has_work(const model::Batch& batch) const override {
    return batch.pairs() > 0;
  }
};
void describe_pair_step(const LossSums& global, std::int64_t pairs, StepMetrics& m);

// The lm_head's backward with each counted row's gradient weighted by d_rows (C): d(loss)/d(the
// row's cross-entropy), as DPO's and GRPO's losses give it (the logits are built again, a block
// at a time, rather than kept for the whole batch, times logit_scale as the forward built them:
// GRPO's at the sampling temperature); then the model's backward.
void weighted_lm_head_backward(model::LlamaModel& model, const model::HeadInputs& in,
                               kernels::ConstTensorView d_rows, const char* what,
                               float logit_scale = 1.0F);
[[nodiscard]] EvalMetrics pair_eval_metrics(EvalTotals global);

}  // namespace l3::train
