// The Llama 3 decoder written once against kernels::Ops: forward and backward of SFT
// (lm_head + masked cross-entropy) and reward (score head + Bradley-Terry) micro-batches.
//
//   x0 = embed(tokens)
//   block l:  h = x + o_proj(attn(rope(q), rope(k), v)) with q, k, v from rmsnorm(x)
//             x' = h + down(silu(gate(n)) * up(n)),      n = rmsnorm(h)
//   out = rmsnorm(x_L); logits = out lm_head^T, or score = out[last token] . w_score
//
// Parameters and gradients are flat buffers laid out by ParameterLayout. Backward passes add
// into the gradients, so micro-batches accumulate until zero_gradients(). With LoRA the model's
// weights are frozen and what trains (gradients, master weights, the optimizer's state) is the
// adapter buffer, laid out by trainable_layout().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/cpu/bradley_terry.hpp"
#include "kernels/ops.hpp"
#include "model/batch.hpp"
#include "model/decoder_block.hpp"
#include "model/dpo_settings.hpp"
#include "model/gradient_window.hpp"
#include "model/lora_config.hpp"
#include "model/parameter_layout.hpp"
#include "model/parameter_window.hpp"

namespace l3::model {

struct ModelOptions {
  // Keep only each block's input in the forward and recompute the block's activations in the
  // backward: memory O(layers x N x H) instead of O(layers x N x (H + 3 I + ...)), same
  // gradients bit for bit.
  bool recompute = false;
  // When the backend computes in bf16: keep a whole fp32 master copy of the weights here.
  // Training keeps it in the optimizer's ZeRO-1 shards instead (false).
  bool keep_master = true;
  // Hold a flat gradient buffer for the whole model. false: the backward writes into a
  // GradientWindow (set_gradient_window) that holds a few layers at a time (ZeRO-2).
  bool own_gradients = true;
  // Hold the flat parameter buffer. false (parameter sharding, ZeRO-3): the model holds no
  // weights and reads them through a ParameterWindow (set_parameter_window); parameters() is
  // empty, and initialisation, loading and master_to_host() are the window owner's.
  bool own_parameters = true;
  // Hold that buffer in fp32 even when the backend computes in bf16, so that what adds up in it
  // (micro-batches, lm_head blocks, the tied embedding's two uses) is rounded once, by the
  // optimizer's read, instead of once per addition.
  bool fp32_gradients = false;
  // LoRA adapters (rank > 0): the model's own weights are frozen (no gradients, and no fp32
  // master copy beside bf16 ones) and the adapters, with a reward model's score head, train.
  // keep_master, own_gradients and fp32_gradients then apply to the adapter buffer.
  LoraConfig lora{};
};

// What training micro-batches add up (the last three for preference pairs only).
struct LossSums {
  double loss = 0.0;     // summed cross-entropy of counted tokens, or summed pair losses
  double correct = 0.0;  // pairs whose chosen score (DPO: reward) is the higher
  double margin = 0.0;   // summed chosen - rejected scores (DPO: rewards)
  double chosen = 0.0;   // DPO: summed chosen rewards
};

struct RewardOutput {
  kernels::cpu::PreferenceStats stats;
  std::vector<float> chosen;  // score of each pair's chosen sequence
  std::vector<float> rejected{};
};

class LlamaModel {
 public:
  LlamaModel(const ModelConfig& config, HeadKind head, kernels::Ops& ops,
             ModelOptions options = {});
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;
  LlamaModel(LlamaModel&&) = delete;
  LlamaModel& operator=(LlamaModel&&) = delete;

  [[nodiscard]] const ParameterLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const ModelConfig& config() const noexcept { return layout_.config(); }
  [[nodiscard]] kernels::Ops& ops() const noexcept { return ops_; }
  [[nodiscard]] const ModelOptions& options() const noexcept { return options_; }

  // What training updates: the adapter layout with LoRA, layout() itself without.
  [[nodiscard]] const ParameterLayout& trainable_layout() const noexcept {
    return adapters_ ? *adapters_ : layout_;
  }
  [[nodiscard]] bool has_adapters() const noexcept { return adapters_.has_value(); }

  // The model's flat parameter buffer (layout().total() elements, compute dtype).
  [[nodiscard]] kernels::TensorView parameters() const noexcept { return params_.view(); }
  // The trained buffer (trainable_layout().total(), compute dtype): parameters() without LoRA,
  // the adapters with it.
  [[nodiscard]] kernels::TensorView trainable_parameters() const noexcept {
    return adapters_ ? adapter_params_.view() : params_.view();
  }
  // The fp32 master weights the optimizer updates (trainable layout): trainable_parameters()
  // itself when the backend computes in f32, a separate buffer otherwise; empty when the model
  // keeps none (bf16 without keep_master).
  [[nodiscard]] kernels::TensorView master_weights() const noexcept {
    if (master_.numel() > 0) return master_.view();
    const kernels::TensorView trained = trainable_parameters();
    return trained.dtype() == kernels::DType::f32 ? trained : kernels::TensorView{};
  }
  // What the optimizer must refresh from the master weights: empty when they are the same.
  [[nodiscard]] kernels::TensorView weight_copy() const noexcept {
    return master_.numel() > 0 ? trainable_parameters() : kernels::TensorView{};
  }
  // The trainable layout's gradients; empty without own_gradients.
  [[nodiscard]] kernels::TensorView gradients() const noexcept { return grads_.view(); }
  // A tensor of the trainable layout, else of the model's (a LoRA reward model's trained score
  // head is the adapter layout's "score.weight").
  [[nodiscard]] kernels::TensorView parameter(std::string_view name) const;
  // A tensor of the trainable layout.
  [[nodiscard]] kernels::TensorView gradient(std::string_view name) const;

  // Fresh random parameters (see parameter_init.hpp), adapters included.
  void initialize(std::uint64_t seed);
  // Parameters from host fp32 values laid out by layout() (a checkpoint, an import). The
  // adapters are left alone (initialize_adapters, load_adapters).
  void load_parameters(std::span<const float> host);
  // LoRA: fresh adapters (A from the seed, B = 0) and, for a reward model, the trained score
  // head copied from the model's (as loaded, in the compute dtype).
  void initialize_adapters(std::uint64_t seed);
  // The values initialize_adapters loads, on the host (trainable layout, fp32): for master
  // weights kept outside the model. `score`: a reward model's score head as loaded (fp32, H
  // values), for a model that does not hold its weights (they are rounded to the compute dtype
  // as the model's own would be); empty: the model's.
  [[nodiscard]] std::vector<float> initial_adapter_values(std::uint64_t seed,
                                                          std::span<const float> score = {}) const;
  // LoRA: the trainable layout's values from the host (a checkpoint, a PEFT adapter).
  void load_adapters(std::span<const float> host);
  // The fp32 master weights of the trainable layout, copied to the host (checkpoints,
  // generation on another backend); the compute weights widened to fp32 when the model keeps
  // no master.
  [[nodiscard]] std::vector<float> master_to_host() const;
  void zero_gradients();
  // LoRA's dropout masks in the training passes that follow are drawn from this seed (with the
  // layer and the target); a trainer sets one per micro-batch so that a rerun or a restart draws
  // the same masks. Evaluation passes draw none.
  void set_dropout_seed(std::uint64_t seed) noexcept { dropout_seed_ = seed; }

  // Called during a backward pass each time the gradients of [offset, layout().total()) are
  // complete for this micro-batch (after the lm_head/score head and each block, in reverse
  // layout order, and finally with 0 after the embedding), so that data parallelism can
  // start reducing them while the rest of the backward runs. Empty: no calls. On a backend
  // with a stream the work is queued, not done: the hook must order its use after it.
  using GradientReadyHook = std::function<void(std::int64_t offset)>;
  void set_gradient_ready_hook(GradientReadyHook hook) { gradient_ready_ = std::move(hook); }
  // Where backward passes write their gradients without own_gradients (not owned; it must
  // outlive the passes). Its ready() is called where the hook is.
  void set_gradient_window(GradientWindow* window) noexcept { window_ = window; }
  // Where forward and backward passes read the weights from instead of parameters() (not
  // owned; it must outlive the passes; null: parameters()). The passes acquire each gradient
  // group before reading it (ParameterWindow), in layout order forward and in reverse
  // backward. Initialisation, loading and the generator still use parameters().
  void set_parameter_window(ParameterWindow* window) noexcept { parameter_window_ = window; }
  // On a rank with no data for a micro-batch that the other ranks run: the window calls that
  // micro-batch's forward (and backward) would make, in the same order, with nothing computed,
  // so that a window gathering weights collectively stays in step with the other ranks; with a
  // backward, the gradients are reported complete (untouched) where a backward reports them.
  void idle_pass(bool backward);
  // The same for a DPO micro-batch (dpo_accumulate, dpo_eval_accumulate): `reference_pass`
  // when the model computes its reference itself (LoRA: no reference log-probabilities given).
  void idle_dpo_pass(bool backward, bool reference_pass);

  // SFT. The loss is the summed cross-entropy of the counted tokens; gradients are those of
  // grad_scale * loss (grad_scale = 1 / counted tokens of the whole global batch).
  // Reward. Scores are read at each pair's last tokens; the loss is summed over pairs and the
  // gradients are those of grad_scale * loss (grad_scale = 1 / pairs of the global batch).
  //
  // Training steps: the micro-batches' losses add up in backend memory, so that a backend
  // with a queue never waits inside a step: zero_loss_sums(), then sft_accumulate or
  // reward_accumulate (forward + backward) per micro-batch, then loss_sums() once (it waits).
  void zero_loss_sums();
  void sft_accumulate(const Batch& batch, float grad_scale);
  void reward_accumulate(const Batch& batch, float grad_scale, double center_coefficient);
  // DPO: a language model on preference pairs whose masks mark the responses. `reference`: the
  // reference model's log-probabilities of the 2P sequences (chosen, then rejected; as
  // sequence_log_probs gives them), or empty with LoRA: then the model without its adapters is
  // the reference (a forward pass more). The loss is summed over pairs; the gradients are those
  // of grad_scale * loss (grad_scale = 1 / pairs of the global batch).
  void dpo_accumulate(const Batch& batch, float grad_scale, const DpoSettings& settings,
                      std::span<const double> reference);
  [[nodiscard]] LossSums loss_sums() const;

  // Evaluation, likewise: forward passes whose losses add up in backend memory, read once.
  void zero_eval_sums();
  void sft_eval_accumulate(const Batch& batch);
  void dpo_eval_accumulate(const Batch& batch, const DpoSettings& settings,
                           std::span<const double> reference);
  [[nodiscard]] LossSums eval_sums() const;

  // The log-probabilities of a preference batch's 2P sequences' counted tokens (chosen, then
  // rejected), summed in fp64 (`mean`: divided by their counts, IPO's), by a forward pass of
  // the model as it is, or of its frozen base (`adapters` false, LoRA): DPO's reference.
  [[nodiscard]] std::vector<double> sequence_log_probs(const Batch& batch, bool mean,
                                                       bool adapters = true);

  // The loss sums' slots in backend memory (f64): the training step's, evaluation's and single
  // calls'.
  static constexpr int kSumValues = 4;
  static constexpr int kSumSlotCount = 3;
  static constexpr std::int64_t kLossSumElements = std::int64_t{kSumSlotCount} * kSumValues;

  // One micro-batch with its result read back at once (evaluation, tests); the sums of a
  // training step in progress are left alone.
  kernels::LossSum sft_forward_backward(const Batch& batch, float grad_scale);
  [[nodiscard]] kernels::LossSum sft_forward(const Batch& batch);
  RewardOutput reward_forward_backward(const Batch& batch, float grad_scale,
                                       double center_coefficient);
  [[nodiscard]] RewardOutput reward_forward(const Batch& batch, double center_coefficient);

  // Logits (N, V) of every position: for tests and generation on small inputs.
  [[nodiscard]] std::vector<float> logits(const Batch& batch);

 private:
  struct Workspace;

  // Uploads the batch (and DPO's reference log-probabilities, when given).
  void prepare(const Batch& batch, std::span<const double> reference = {});
  void forward_backbone();
  void block_forward(int layer, kernels::ConstTensorView x_in, kernels::TensorView x_out, int slot);
  void backward_backbone();  // from d(final norm output) in d_final_ to the embedding
  void gradients_ready(std::int64_t offset);  // the hook and the window
  // Loss sums in backend memory: one slot for the training step, one for single calls.
  static constexpr int kStepSlot = 0;
  static constexpr int kCallSlot = 1;
  static constexpr int kEvalSlot = 2;
  [[nodiscard]] kernels::TensorView sum_slot(int slot) const;
  [[nodiscard]] LossSums read_sums(int slot) const;
  void sft(const Batch& batch, float grad_scale, bool backward, kernels::TensorView sums);
  void reward(const Batch& batch, float grad_scale, double center, bool backward,
              kernels::TensorView sums);
  RewardOutput reward_call(const Batch& batch, float grad_scale, double center, bool backward);
  void dpo(const Batch& batch, float grad_scale, const DpoSettings& settings,
           std::span<const double> reference, bool backward, kernels::TensorView sums);
  // The prepared batch's counted rows' cross-entropies into the workspace's row_loss (a
  // forward pass from final_out) and its sequences' log-probabilities into `logps` (2P).
  void sequence_log_probs_into(std::int64_t sequences, bool mean, kernels::TensorView logps);
  // A forward pass without dropout (of the frozen base when !adapters) and its sequences'
  // log-probabilities into the workspace's logps (2P).
  void forward_log_probs(std::int64_t sequences, bool mean, bool adapters);
  // The parameter (or its gradient) at `offset`, viewed as `shape`.
  [[nodiscard]] kernels::ConstTensorView weight(std::int64_t offset, kernels::Shape shape) const;
  [[nodiscard]] kernels::TensorView weight_grad(std::int64_t offset, kernels::Shape shape) const;
  // The gradient group (ParameterLayout::gradient_groups) holding layout position `offset`,
  // held for a scope from the parameter window (nothing without one).
  // Block `layer`'s weights, shaped (model/decoder_block.hpp), read through weight().
  [[nodiscard]] BlockWeights layer_weights(int layer) const;
  // Block `layer`'s adapters for this pass (training: with dropout).
  [[nodiscard]] BlockAdapters layer_adapters(int layer) const;
  // Where a frozen (LoRA) or trained weight's gradient goes: empty when frozen.
  [[nodiscard]] kernels::TensorView base_grad(std::int64_t offset, kernels::Shape shape) const {
    return adapters_ ? kernels::TensorView{} : weight_grad(offset, std::move(shape));
  }
  // The adapters of one target, as gradients of the trainable layout.
  [[nodiscard]] LoraGradients adapter_grads(int layer, LoraTarget t) const;
  // The backward of block `layer`'s adapter on target t (if it has one), which fed y from x:
  // its gradients, and its part of dx added to dx.
  void adapter_backward(int layer, const BlockAdapters& adapters, LoraTarget t,
                        kernels::TensorView dx, kernels::ConstTensorView dy,
                        kernels::ConstTensorView x, const BlockViews& a);
  // The reward head's weight and gradient (the adapter layout's with LoRA).
  [[nodiscard]] kernels::ConstTensorView score_weight() const;
  [[nodiscard]] kernels::TensorView score_grad() const;
  // Where the backward reports the head's gradients (-1: nothing trains there) and block l's.
  [[nodiscard]] std::int64_t head_ready_offset() const;
  [[nodiscard]] std::int64_t block_ready_offset(int layer) const;
  [[nodiscard]] std::size_t group_at(std::int64_t offset) const;
  void require_own_parameters(std::string_view what) const;  // internal Error without
  // idle_pass's pieces: one group held and released; forward_backbone's; backward_backbone's.
  void idle_use(std::int64_t offset, Pass pass) const;
  void idle_forward() const;
  void idle_backward();
  [[nodiscard]] HeldGroup hold(std::int64_t offset, Pass pass) const {
    return {parameter_window_, group_at(offset), pass};
  }

  ParameterLayout layout_;
  std::optional<ParameterLayout> adapters_;  // LoRA's trainable layout
  std::vector<FlatRange> groups_;            // layout_.gradient_groups()
  std::vector<FlatRange> adapter_groups_;    // adapters_->gradient_groups()
  kernels::Ops& ops_;
  ModelOptions options_;
  kernels::Buffer params_;
  kernels::Buffer adapter_params_;  // LoRA: (adapters_->total()) compute dtype
  kernels::Buffer master_;          // of the trainable layout; empty when the compute dtype is f32
  kernels::Buffer grads_;           // of the trainable layout
  std::uint64_t dropout_seed_ = 0;
  bool without_adapters_ = false;  // a pass of the frozen base model (DPO's LoRA reference)
  kernels::Buffer sums_;           // (kSumSlotCount, kSumValues) f64
  std::unique_ptr<Workspace> ws_;
  GradientReadyHook gradient_ready_;
  GradientWindow* window_ = nullptr;
  ParameterWindow* parameter_window_ = nullptr;
};

}  // namespace l3::model
