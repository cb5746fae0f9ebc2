// The Llama 3 decoder written once against kernels::Ops: the backbone's forward and backward
// over a micro-batch, and its heads' weights. What is computed from the last hidden states (a
// loss and its gradient: cross-entropy, Bradley-Terry, DPO) is an objective's
// (src/train/objectives/): it reads head() and the head's weights, and writes head().d_hidden
// for backward().
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

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/idle_ops.hpp"
#include "kernels/ops.hpp"
#include "model/batch.hpp"
#include "model/context_exchange.hpp"
#include "model/decoder_block.hpp"
#include "model/gradient_window.hpp"
#include "model/lora_config.hpp"
#include "model/parameter_layout.hpp"
#include "model/parameter_window.hpp"
#include "model/placement.hpp"
#include "model/tensor_exchange.hpp"
#include "model/tensor_slice.hpp"

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
  // Tensor parallelism: this model is rank `tensor.rank` of a group of `tensor.ranks`, holding
  // its heads, MLP columns and vocabulary rows (model/tensor_slice.hpp): layout() and config()
  // are the slice's. Its passes need the group's exchanges (set_tensor_exchange). Not with LoRA
  // so far.
  TensorSlice tensor{};

  // The buffers a model holds under `placement` (model/placement.hpp): no fp32 master copy
  // where the optimizers keep it (or nothing trains), no whole gradient buffer where ZeRO-2's
  // slots take the gradients (or nothing trains), no weights where they are sharded.
  [[nodiscard]] static ModelOptions of(const Placement& placement, bool recompute = false,
                                       const LoraConfig& lora = {}) noexcept {
    return {.recompute = recompute,
            .keep_master = !placement.forward_only && !placement.master_in_optimizer,
            .own_gradients = !placement.forward_only && !placement.shards_gradients(),
            .own_parameters = placement.model_holds_weights(),
            .fp32_gradients = placement.fp32_gradients,
            .lora = lora};
  }
};

// Where one micro-batch's LoRA dropout masks are drawn: CounterRng(seed, lora_dropout, stream
// step), block `layer`'s target t at index first_index(layer) + t. Every (rank, micro-batch,
// layer, target) of a step draws its own mask seed, the same in a rerun or a restart.
struct DropoutDraw {
  std::uint64_t seed = 0;         // the run's --seed
  std::uint64_t step = 0;         // optimizer steps done
  std::uint64_t rank = 0;         // < 2^28
  std::uint64_t micro_batch = 0;  // < 2^20

  [[nodiscard]] std::uint64_t first_index(int layer) const noexcept {
    return (((rank << 20U) + micro_batch) << 16U | static_cast<std::uint64_t>(layer)) << 4U;
  }
};

// What an objective's head reads after forward(), and where its backward writes: views of the
// loaded micro-batch (N rows, C counted positions, 2P sequences of P pairs).
struct HeadInputs {
  std::int64_t counted = 0;                 // C
  std::int64_t sequences = 0;               // 2P: the chosen sequences, then the rejected ones
  kernels::TensorView hidden{};             // (N, H) the final norm's output
  kernels::TensorView d_hidden{};           // (N, H) d(loss)/d(hidden): backward() reads it
  kernels::ConstTensorView loss_rows{};     // (C) i32 the counted positions, ascending
  kernels::ConstTensorView loss_targets{};  // (C) i32 the tokens they predict
  kernels::ConstTensorView score_rows{};    // (2P) i32 each sequence's last token
  kernels::ConstTensorView margins{};       // (P) f32 the pairs' margins (when the batch has them)
  kernels::ConstTensorView ranges{};        // (2P, 2) i32 each sequence's counted rows [begin, end)
  kernels::ConstTensorView reference{};     // (2P) f64 what load_batch was given with the batch
  // Scratch a head may use for this pass (the memory plan counts it): four f32 and one f64
  // value per row (scores and their gradients, per-row losses and theirs, log-probabilities).
  std::array<kernels::TensorView, 4> row_f32{};  // (N) f32 each
  kernels::TensorView row_f64{};                 // (N) f64
};

// Where a head's losses add up in backend memory (LlamaModel::sums): a training step's
// micro-batches, an evaluation's batches, or one call read back at once.
enum class SumSlot : std::uint8_t { step, eval, call };

// How forward() runs.
struct PassOptions {
  bool training = false;  // a backward follows: LoRA's dropout applies
  bool adapters = true;   // false: the frozen base model without its LoRA adapters
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
  // The model this one is a tensor-parallel slice of (config() itself without one): what
  // checkpoints, FLOP counts and token checks describe.
  [[nodiscard]] const ModelConfig& whole_config() const noexcept { return whole_config_; }
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
  // LoRA's dropout masks in the training passes that follow: drawn from CounterRng (purpose
  // lora_dropout) at this draw's counters, with the layer and the target; a trainer sets one per
  // micro-batch so that a rerun or a restart draws the same masks. Evaluation passes draw none.
  void set_dropout_draw(const DropoutDraw& draw) noexcept { dropout_draw_ = draw; }

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
  // Context parallelism: the group's exchanges (not owned; it must outlive the passes). A
  // batch that is a share (data::Batch::context_rows) needs one: its queries attend to the
  // whole sequence's keys and values, gathered from the group in each layer's attention.
  void set_context_exchange(ContextExchange* exchange) noexcept { context_ = exchange; }
  // Tensor parallelism: the group's exchanges (not owned; it must outlive the passes), needed
  // by every pass of a model built with ModelOptions::tensor.
  void set_tensor_exchange(TensorExchange* exchange);
  [[nodiscard]] const TensorSlice& tensor_slice() const noexcept { return options_.tensor; }
  // The embedding's and lm_head's rows as ids of the whole vocabulary (whole 0: not sliced).
  [[nodiscard]] kernels::VocabSlice vocab_slice() const noexcept { return vocab_share_.slice; }
  // What an lm_head_cross_entropy over lm_head_weight() takes as its `vocab`: null without
  // tensor parallelism. A head's d_hidden is then this slice's part, which backward() sums over
  // the group.
  [[nodiscard]] const kernels::VocabShare* vocab_share() const noexcept {
    return options_.tensor.active() ? &vocab_share_ : nullptr;
  }
  // Context parallelism, a loaded share's counted rows over the whole batch: `local` (C) values
  // of this rank's counted rows (their cross-entropies, say) and the group's, in the whole's
  // token order (`values`), with each sequence's range of them (`ranges`, (2P, 2) as
  // HeadInputs::ranges) and where this rank's rows are in them (`mine`). What a loss over whole
  // sequences (DPO's) computes from, the same on every rank of the group. Collective.
  struct WholeRows {
    std::vector<float> values;
    std::vector<std::int32_t> ranges;
    std::vector<std::int32_t> mine;
  };
  [[nodiscard]] WholeRows gather_counted_rows(kernels::ConstTensorView local) const;
  // Whether the loaded batch is a context-parallel share.
  [[nodiscard]] bool holds_share() const noexcept;
  // A loaded share's row of each sequence's last token (chosen, then rejected), or -1 where
  // another rank of the group holds it (a reward head's scores are read there).
  [[nodiscard]] std::span<const std::int32_t> share_sequence_rows() const noexcept;
  // The group set_context_exchange gave (internal Error without one).
  [[nodiscard]] ContextExchange& context_exchange() const;
  // Where forward and backward passes read the weights from instead of parameters() (not
  // owned; it must outlive the passes; null: parameters()). The passes acquire each gradient
  // group before reading it (ParameterWindow), in layout order forward and in reverse
  // backward. Initialisation, loading and the generator still use parameters().
  void set_parameter_window(ParameterWindow* window) noexcept { parameter_window_ = window; }
  [[nodiscard]] bool has_parameter_window() const noexcept { return parameter_window_ != nullptr; }
  // A pass over one micro-batch: load_batch() uploads it (with `reference`, 2P values an
  // objective reads back from head().reference, or none), forward() runs the embedding, the
  // blocks and the final norm into head().hidden, the objective's head reads it (holding
  // hold_head() while it reads the head's weights) and, for a backward, writes head().d_hidden;
  // backward() then runs from there to the embedding, adding into the gradients and reporting
  // them complete. forward() may run again on the loaded batch (DPO with LoRA: the frozen base,
  // then the policy).
  //
  // A batch of no rows (a rank with no data for a micro-batch that the other ranks run) takes
  // the same path: its parameter-window and gradient-ready calls are those of a real pass, so
  // that a window gathering weights collectively stays in step with the other ranks, and
  // nothing is computed: pass_ops() is then an IdleOps.
  void load_batch(const Batch& batch, std::span<const double> reference = {});
  void forward(const PassOptions& options);
  void backward();
  [[nodiscard]] HeadInputs head() const;
  // The backend for the loaded batch's head: ops(), or one that computes nothing on no rows.
  [[nodiscard]] kernels::Ops& pass_ops() const noexcept { return *pass_; }
  // The head's weight group held for a scope from the parameter window (nothing without one):
  // the lm_head of a language model, the score head of a reward model.
  [[nodiscard]] HeldGroup hold_head(Pass pass) const;
  // The lm_head (V, H) and its gradient (empty when frozen: LoRA); read under hold_head().
  [[nodiscard]] kernels::ConstTensorView lm_head_weight() const;
  [[nodiscard]] kernels::TensorView lm_head_grad() const;
  // The reward head's weight (H) and gradient (the adapter layout's with LoRA).
  [[nodiscard]] kernels::ConstTensorView score_weight() const;
  [[nodiscard]] kernels::TensorView score_grad() const;

  // Loss sums in backend memory, kSumValues f64 per slot, that heads add into, so that a
  // backend with a queue never waits inside a step: zero_sums(), the passes, then read_sums()
  // once (it waits). What the values mean is the objective's.
  static constexpr int kSumValues = 11;
  static constexpr int kSumSlotCount = 3;
  static constexpr std::int64_t kLossSumElements = std::int64_t{kSumSlotCount} * kSumValues;
  [[nodiscard]] kernels::TensorView sums(SumSlot slot) const;
  void zero_sums(SumSlot slot);
  [[nodiscard]] std::array<double, kSumValues> read_sums(SumSlot slot) const;

  // Generation's pass (GenerationEngine): rows of sequences whose earlier positions the
  // caller keeps in a KV cache. The tokens (n) i32 are embedded into x (n, H), then every block
  // runs on the n rows of `block` with `attend(layer)` as its attention (it reads block.q,
  // block.k after RoPE and block.v, and writes block.att), leaving the last block's output in x
  // (no final norm: final_norm() takes the rows that need logits). Each weight group is
  // acquired once for all the rows (a sharded model gathers each layer once per pass; with n
  // = 0 the pass computes nothing and still takes part in the gathers). LoRA adapters apply,
  // without dropout.
  struct RowPass {
    kernels::ConstTensorView tokens;  // (n) i32
    RopeViews rope;                   // the rows' absolute positions and the backend's tables
    kernels::TensorView x;            // (n, H)
    BlockViews block;                 // n rows each
    kernels::Ops* ops = nullptr;      // a decorator of ops() to run on (row-invariant); null: ops()
  };
  void forward_rows(const RowPass& pass, const std::function<void(int layer)>& attend);
  // out (m, H) = the final norm of x (m, H); rstd (m) f32.
  void final_norm(kernels::TensorView out, kernels::TensorView rstd, kernels::ConstTensorView x);

  // Logits (N, V) of every position, whole: for tests on small inputs only (training,
  // evaluation and generation never hold a sequence's logits: target_log_probs).
  [[nodiscard]] std::vector<float> logits(const Batch& batch);
  // The log-probability of each counted position's target (the batch's loss_mask), in position
  // order: -(its cross-entropy) from lm_head_cross_entropy, whose logits exist a block of rows
  // at a time (the backend's block: kernels/cpu/cross_entropy.cpp, cuda::logit_block_rows), at
  // logit_scale (lm_head_cross_entropy's). adapters false: LoRA's base model. Every rank of a
  // ZeRO-3 or context-parallel run takes part (a batch of no rows: none computed).
  [[nodiscard]] std::vector<float> target_log_probs(const Batch& batch, float logit_scale = 1.0F,
                                                    bool adapters = true);

 private:
  struct Workspace;

  void forward_backbone();
  void block_forward(int layer, kernels::ConstTensorView x_in, kernels::TensorView x_out, int slot);
  void backward_backbone();  // from d(final norm output) in d_final_ to the embedding
  void gradients_ready(std::int64_t offset);  // the hook and the window
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
  // Block `layer`'s weight gradients (empty views where the weights are frozen), and its
  // adapters' with their work buffers (for decoder_block_backward).
  [[nodiscard]] BlockGradients layer_gradients(int layer) const;
  [[nodiscard]] BlockAdapterGradients layer_adapter_gradients(int layer,
                                                              const BlockAdapters& adapters) const;
  // Where the backward reports the head's gradients (-1: nothing trains there) and block l's.
  [[nodiscard]] std::int64_t head_ready_offset() const;
  [[nodiscard]] std::int64_t block_ready_offset(int layer) const;
  [[nodiscard]] std::size_t group_at(std::int64_t offset) const;
  // Context parallelism, a share's attention: the whole row's keys and values gathered from the
  // group (forward and backward each gather them), this rank's queries against them; the
  // backward's key and value gradients reduce-scattered to their ranks.
  struct WholeKeys {
    kernels::TensorView k, v;             // (whole, n_kv_heads, head_dim)
    kernels::ConstTensorView query_rows;  // this rank's tokens in the whole
  };
  WholeKeys gather_whole_keys(const BlockViews& a);
  void attention_share(const BlockViews& a);
  void attention_backward_share(const BlockViews& a);
  void require_own_parameters(std::string_view what) const;  // internal Error without
  [[nodiscard]] HeldGroup hold(std::int64_t offset, Pass pass) const {
    return {parameter_window_, group_at(offset), pass};
  }

  ModelConfig whole_config_;
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
  DropoutDraw dropout_draw_{};
  bool without_adapters_ = false;  // a pass of the frozen base model (DPO's LoRA reference)
  kernels::Buffer sums_;           // (kSumSlotCount, kSumValues) f64
  kernels::IdleOps idle_ops_;      // the loaded batch's backend when it has no rows
  kernels::Ops* pass_ = &ops_;     // the loaded batch's backend
  std::unique_ptr<Workspace> ws_;
  GradientReadyHook gradient_ready_;
  GradientWindow* window_ = nullptr;
  ParameterWindow* parameter_window_ = nullptr;
  ContextExchange* context_ = nullptr;
  TensorExchange* tensor_ = nullptr;
  kernels::VocabShare vocab_share_{};
  // x summed over the tensor-parallel group; empty without one.
  [[nodiscard]] TensorReduce tensor_reduce();
};

}  // namespace l3::model
