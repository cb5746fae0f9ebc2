#include "model/llama_model.hpp"

#include <fmt/format.h>

#include <array>

#include "core/error.hpp"
#include "core/trace_range.hpp"
#include "model/decoder_block.hpp"
#include "model/parameter_init.hpp"
#include "model/rope_table.hpp"

namespace l3::model {

using kernels::Buffer;
using kernels::DType;
using kernels::TensorView;

namespace {

// A host array as a view the backend can copy from (the backend never writes through it).
template <typename T>
TensorView host_view(const std::vector<T>& values) {
  return TensorView(std::span<const T>(values));
}

}  // namespace

// Activations of one decoder block, kept from its forward for its backward.
struct BlockActivations {
  Buffer ln1;    // (N, H)  rmsnorm(x)
  Buffer rstd1;  // (N)
  Buffer q;      // (N, n_heads, head_dim), after RoPE
  Buffer k;      // (N, n_kv_heads, head_dim), after RoPE
  Buffer v;      // (N, n_kv_heads, head_dim)
  Buffer att;    // (N, n_heads, head_dim)  attention output, before o_proj
  Buffer lse;    // (n_heads, N)
  Buffer h;      // (N, H)  x + o_proj(att)
  Buffer ln2;    // (N, H)  rmsnorm(h)
  Buffer rstd2;  // (N)
  Buffer gate;   // (N, I)
  Buffer up;     // (N, I)
  Buffer act;    // (N, I)  silu(gate) * up
};

// A micro-batch's inputs on the backend.
struct InputBuffers {
  Buffer tokens, positions;        // (N)
  Buffer cu_seqlens;               // (segments + 1)
  Buffer loss_rows, loss_targets;  // (C) the counted positions and the tokens they predict
  Buffer score_rows;               // (2P) the chosen, then the rejected last tokens (reward)
  Buffer margins;                  // (P) the pairs' margins (reward)
};

struct LlamaModel::Workspace {
  std::int64_t capacity = 0;  // tokens the buffers hold
  // Two sets of inputs, alternating per micro-batch: a backend with a copy queue uploads the
  // next micro-batch's while this one computes (Ops::upload_inputs).
  std::array<InputBuffers, 2> input_sets;
  int current = 0;
  [[nodiscard]] const InputBuffers& in() const {
    return input_sets[static_cast<std::size_t>(current)];
  }
  std::int64_t counted = 0;                   // C
  std::vector<std::int32_t> host_cu_seqlens;  // the same segment table, for AttentionShape
  RopeBuffers rope;
  // forward
  std::vector<Buffer> layer_inputs;  // n_layers + 1 of (N, H): the residual stream
  std::vector<BlockActivations> blocks;
  Buffer final_out, final_rstd;
  // backward
  Buffer d_resid, d_final, d_ln, d_att, d_q, d_k, d_v, d_act, d_gate, d_up, scratch_out;
  Buffer scores, d_scores;
  // the current micro-batch
  std::int64_t n = 0;
  kernels::AttentionShape shape;
};

namespace {

// The first n rows of a block's activation buffers.
BlockViews block_views(const BlockActivations& b, std::int64_t n, const ModelConfig& c) {
  const std::int64_t h = c.hidden_size;
  const std::int64_t i = c.intermediate_size;
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();
  return {.ln1 = b.ln1.slice(0, n * h),
          .rstd1 = b.rstd1.slice(0, n),
          .q = b.q.slice(0, n * q),
          .k = b.k.slice(0, n * kv),
          .v = b.v.slice(0, n * kv),
          .att = b.att.slice(0, n * q),
          .lse = b.lse.slice(0, n * c.n_heads),
          .h = b.h.slice(0, n * h),
          .ln2 = b.ln2.slice(0, n * h),
          .rstd2 = b.rstd2.slice(0, n),
          .gate = b.gate.slice(0, n * i),
          .up = b.up.slice(0, n * i),
          .act = b.act.slice(0, n * i)};
}

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, HeadKind head, kernels::Ops& ops,
                       ModelOptions options)
    : layout_(config, head),
      ops_(ops),
      options_(options),
      params_(ops.allocate(ops.compute_dtype(), layout_.total())),
      master_(ops.compute_dtype() == DType::f32 || !options.keep_master
                  ? Buffer{}
                  : ops.allocate(DType::f32, layout_.total())),
      grads_(options.own_gradients
                 ? ops.allocate(options.fp32_gradients ? DType::f32 : ops.compute_dtype(),
                                layout_.total())
                 : Buffer{}),
      sums_(ops.allocate(DType::f64, kLossSumElements)),
      ws_(std::make_unique<Workspace>()) {}

LlamaModel::~LlamaModel() = default;

TensorView LlamaModel::weight(std::int64_t offset, std::int64_t numel) const {
  return params_.slice(offset, numel);
}
TensorView LlamaModel::weight_grad(std::int64_t offset, std::int64_t numel) const {
  if (options_.own_gradients) return grads_.slice(offset, numel);
  if (window_ == nullptr) {
    throw core::internal_error("a backward pass of a model without gradients or gradient window");
  }
  return window_->gradients(offset, numel);
}

void LlamaModel::gradients_ready(std::int64_t offset) {
  if (gradient_ready_) gradient_ready_(offset);
  if (window_ != nullptr && !options_.own_gradients) window_->ready(offset);
}
TensorView LlamaModel::parameter(std::string_view name) const {
  const TensorInfo& t = layout_.find(name);
  return weight(t.offset, t.numel);
}
TensorView LlamaModel::gradient(std::string_view name) const {
  const TensorInfo& t = layout_.find(name);
  return weight_grad(t.offset, t.numel);
}

void LlamaModel::initialize(std::uint64_t seed) {
  std::vector<float> host(static_cast<std::size_t>(layout_.total()));
  initialize_parameters(host, layout_, seed);
  ops_.copy(params_.view(), host_view(host));  // rounds to the compute dtype
  if (master_.numel() > 0) ops_.copy(master_.view(), host_view(host));
}

void LlamaModel::load_parameters(std::span<const float> host) {
  if (static_cast<std::int64_t>(host.size()) != layout_.total()) {
    throw core::internal_error(
        fmt::format("load_parameters: {} values for a layout of {}", host.size(), layout_.total()));
  }
  ops_.copy(params_.view(), TensorView(host));
  if (master_.numel() > 0) ops_.copy(master_.view(), TensorView(host));
}

std::vector<float> LlamaModel::master_to_host() const {
  std::vector<float> host(static_cast<std::size_t>(layout_.total()));
  const TensorView master = master_weights();
  ops_.copy(TensorView(std::span<float>(host)), master.empty() ? params_.view() : master);
  ops_.synchronize();
  return host;
}

void LlamaModel::zero_gradients() {
  if (options_.own_gradients) ops_.zero(grads_.view());
}

void LlamaModel::prepare(const Batch& batch) {
  const core::TraceRange range("batch upload");
  const ModelConfig& c = config();
  batch.validate(c.vocab_size);
  Workspace& ws = *ws_;
  const std::int64_t n = batch.tokens_count();
  const DType act = ops_.compute_dtype();
  const std::int64_t h = c.hidden_size;
  const std::int64_t i = c.intermediate_size;
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();

  if (n > ws.capacity) {
    Workspace fresh;
    fresh.capacity = n;
    auto alloc = [&](DType dtype, std::int64_t count) { return ops_.allocate(dtype, count); };
    for (InputBuffers& set : fresh.input_sets) {
      set = {alloc(DType::i32, n),    alloc(DType::i32, n), alloc(DType::i32, n + 1),
             alloc(DType::i32, n),    alloc(DType::i32, n), alloc(DType::i32, n),
             alloc(DType::f32, n / 2)};
    }
    fresh.current = ws.current;
    fresh.scores = alloc(DType::f32, n);
    fresh.d_scores = alloc(DType::f32, n);
    for (int l = 0; l <= c.n_layers; ++l) fresh.layer_inputs.push_back(alloc(act, n * h));
    const int slots = options_.recompute ? 1 : c.n_layers;
    for (int s = 0; s < slots; ++s) {
      fresh.blocks.push_back({alloc(act, n * h), alloc(DType::f32, n), alloc(act, n * q),
                              alloc(act, n * kv), alloc(act, n * kv), alloc(act, n * q),
                              alloc(DType::f32, n * c.n_heads), alloc(act, n * h),
                              alloc(act, n * h), alloc(DType::f32, n), alloc(act, n * i),
                              alloc(act, n * i), alloc(act, n * i)});
    }
    fresh.final_out = alloc(act, n * h);
    fresh.final_rstd = alloc(DType::f32, n);
    fresh.d_resid = alloc(act, n * h);
    fresh.d_final = alloc(act, n * h);
    fresh.d_ln = alloc(act, n * h);
    fresh.d_att = alloc(act, n * q);
    fresh.d_q = alloc(act, n * q);
    fresh.d_k = alloc(act, n * kv);
    fresh.d_v = alloc(act, n * kv);
    fresh.d_act = alloc(act, n * i);
    fresh.d_gate = alloc(act, n * i);
    fresh.d_up = alloc(act, n * i);
    fresh.scratch_out = alloc(act, n * h);
    fresh.rope = std::move(ws.rope);
    ws = std::move(fresh);
  }
  if (batch.seq_len > c.max_position_embeddings) {
    throw core::usage_error(
        fmt::format("sequence length {} exceeds the model's max_position_embeddings {}",
                    batch.seq_len, c.max_position_embeddings));
  }
  ws.rope.ensure(ops_, c, batch.seq_len);

  ws.n = n;
  // The counted rows are listed here, on the host, where the mask is: the backend then knows
  // how much lm_head work there is without reading anything back.
  std::vector<std::int32_t> rows;
  std::vector<std::int32_t> targets;
  rows.reserve(static_cast<std::size_t>(n));
  targets.reserve(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) {
    if (batch.loss_mask[static_cast<std::size_t>(t)] == 0) continue;
    rows.push_back(static_cast<std::int32_t>(t));
    targets.push_back(batch.targets[static_cast<std::size_t>(t)]);
  }
  ws.counted = static_cast<std::int64_t>(rows.size());
  std::vector<std::int32_t> score_rows(batch.chosen_last);  // chosen, then rejected
  score_rows.insert(score_rows.end(), batch.rejected_last.begin(), batch.rejected_last.end());

  ws.current = 1 - ws.current;
  const InputBuffers& in = ws.in();
  auto upload = [](const Buffer& dst, const auto& host) {
    return kernels::HostUpload{dst.slice(0, static_cast<std::int64_t>(host.size())),
                               host_view(host)};
  };
  const std::array<kernels::HostUpload, 7> uploads{
      upload(in.tokens, batch.tokens),         upload(in.positions, batch.positions),
      upload(in.cu_seqlens, batch.cu_seqlens), upload(in.loss_rows, rows),
      upload(in.loss_targets, targets),        upload(in.score_rows, score_rows),
      upload(in.margins, batch.margins)};
  ops_.upload_inputs(ws.current, uploads);
  ws.host_cu_seqlens.assign(batch.cu_seqlens.begin(), batch.cu_seqlens.end());
  ws.shape = {n,
              c.n_heads,
              c.n_kv_heads,
              c.head_dim,
              static_cast<int>(batch.segments()),
              static_cast<int>(batch.longest_segment()),
              ws.host_cu_seqlens};
}

void LlamaModel::forward_backbone() {
  const ModelConfig& c = config();
  Workspace& ws = *ws_;
  const std::int64_t n = ws.n;
  const std::int64_t h = c.hidden_size;
  {
    const core::TraceRange range("embedding");
    ops_.embedding(ws.layer_inputs[0].slice(0, n * h), ws.in().tokens.slice(0, n),
                   weight(layout_.embedding(), c.vocab_size * h), n, h);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    block_forward(l, ws.layer_inputs[static_cast<std::size_t>(l)].slice(0, n * h),
                  ws.layer_inputs[static_cast<std::size_t>(l) + 1].slice(0, n * h),
                  options_.recompute ? 0 : l);
  }
  ops_.rmsnorm(ws.final_out.slice(0, n * h), ws.final_rstd.slice(0, n),
               ws.layer_inputs.back().slice(0, n * h), weight(layout_.final_norm(), h), n, h,
               static_cast<float>(c.rms_norm_eps));
}

void LlamaModel::block_forward(int layer, TensorView x_in, TensorView x_out, int slot) {
  const core::TraceRange range("block {} forward", layer);
  const ModelConfig& c = config();
  Workspace& ws = *ws_;
  const BlockViews a = block_views(ws.blocks[static_cast<std::size_t>(slot)], ws.n, c);
  decoder_block_forward(
      ops_, c, block_weights(layout_, params_.view(), layer),
      {.positions = ws.in().positions.slice(0, ws.n), .cos = ws.rope.cos(), .sin = ws.rope.sin()},
      ws.n, x_in, x_out, a,
      [&] { ops_.attention(a.att, a.lse, a.q, a.k, a.v, ws.in().cu_seqlens.view(), ws.shape); });
}

void LlamaModel::backward_backbone() {
  const ModelConfig& c = config();
  Workspace& ws = *ws_;
  const std::int64_t n = ws.n;
  const std::int64_t h = c.hidden_size;
  const std::int64_t i = c.intermediate_size;
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();
  const TensorView d_resid = ws.d_resid.slice(0, n * h);  // d(loss)/d(residual stream)

  ops_.zero(d_resid);
  ops_.rmsnorm_backward(d_resid, weight_grad(layout_.final_norm(), h), ws.d_final.slice(0, n * h),
                        ws.layer_inputs.back().slice(0, n * h), weight(layout_.final_norm(), h),
                        ws.final_rstd.slice(0, n), n, h);
  gradients_ready(layout_.final_norm());  // and the head after it

  for (int l = c.n_layers - 1; l >= 0; --l) {
    const core::TraceRange range("block {} backward", l);
    const TensorView x_in = ws.layer_inputs[static_cast<std::size_t>(l)].slice(0, n * h);
    const int slot = options_.recompute ? 0 : l;
    if (options_.recompute) block_forward(l, x_in, ws.scratch_out.slice(0, n * h), slot);
    const BlockActivations& a = ws.blocks[static_cast<std::size_t>(slot)];
    const BlockOffsets& w = layout_.block(l);
    const TensorView d_ln = ws.d_ln.slice(0, n * h);

    // MLP half. d_resid holds d(x'); the residual passes it on to d(h) unchanged.
    const TensorView d_act = ws.d_act.slice(0, n * i);
    ops_.matmul_backward(d_act, weight_grad(w.down_proj, h * i), d_resid, a.act.slice(0, n * i),
                         weight(w.down_proj, h * i), n, h, i, false);
    ops_.swiglu_backward(ws.d_gate.slice(0, n * i), ws.d_up.slice(0, n * i), d_act,
                         a.gate.slice(0, n * i), a.up.slice(0, n * i), n * i);
    ops_.matmul_backward(d_ln, weight_grad(w.gate_proj, i * h), ws.d_gate.slice(0, n * i),
                         a.ln2.slice(0, n * h), weight(w.gate_proj, i * h), n, i, h, false);
    ops_.matmul_backward(d_ln, weight_grad(w.up_proj, i * h), ws.d_up.slice(0, n * i),
                         a.ln2.slice(0, n * h), weight(w.up_proj, i * h), n, i, h, true);
    ops_.rmsnorm_backward(d_resid, weight_grad(w.post_attention_norm, h), d_ln, a.h.slice(0, n * h),
                          weight(w.post_attention_norm, h), a.rstd2.slice(0, n), n, h);

    // Attention half. d_resid holds d(h); the residual passes it on to d(x).
    const TensorView d_att = ws.d_att.slice(0, n * q);
    const TensorView d_q = ws.d_q.slice(0, n * q);
    const TensorView d_k = ws.d_k.slice(0, n * kv);
    const TensorView d_v = ws.d_v.slice(0, n * kv);
    ops_.matmul_backward(d_att, weight_grad(w.o_proj, h * q), d_resid, a.att.slice(0, n * q),
                         weight(w.o_proj, h * q), n, h, q, false);
    ops_.attention_backward(d_q, d_k, d_v, d_att, a.att.slice(0, n * q),
                            a.lse.slice(0, n * c.n_heads), a.q.slice(0, n * q),
                            a.k.slice(0, n * kv), a.v.slice(0, n * kv), ws.in().cu_seqlens.view(),
                            ws.shape);
    ops_.rope_backward(d_q, ws.in().positions.slice(0, n), ws.rope.cos(), ws.rope.sin(), n,
                       c.n_heads, c.head_dim);
    ops_.rope_backward(d_k, ws.in().positions.slice(0, n), ws.rope.cos(), ws.rope.sin(), n,
                       c.n_kv_heads, c.head_dim);
    ops_.matmul_backward(d_ln, weight_grad(w.q_proj, q * h), d_q, a.ln1.slice(0, n * h),
                         weight(w.q_proj, q * h), n, q, h, false);
    ops_.matmul_backward(d_ln, weight_grad(w.k_proj, kv * h), d_k, a.ln1.slice(0, n * h),
                         weight(w.k_proj, kv * h), n, kv, h, true);
    ops_.matmul_backward(d_ln, weight_grad(w.v_proj, kv * h), d_v, a.ln1.slice(0, n * h),
                         weight(w.v_proj, kv * h), n, kv, h, true);
    ops_.rmsnorm_backward(d_resid, weight_grad(w.input_norm, h), d_ln, x_in,
                          weight(w.input_norm, h), a.rstd1.slice(0, n), n, h);
    gradients_ready(w.q_proj);  // the block's first tensor
  }
  const core::TraceRange range("embedding backward");
  ops_.embedding_backward(weight_grad(layout_.embedding(), c.vocab_size * h),
                          ws.in().tokens.slice(0, n), d_resid, n, h);
  gradients_ready(0);
}

TensorView LlamaModel::sum_slot(int slot) const {
  return sums_.slice(static_cast<std::int64_t>(slot) * kSumValues, kSumValues);
}

LossSums LlamaModel::read_sums(int slot) const {
  std::array<double, kSumValues> host{};
  ops_.copy(TensorView(std::span<double>(host)), sum_slot(slot));
  return {host[0], host[1], host[2]};
}

void LlamaModel::zero_loss_sums() { ops_.zero(sum_slot(kStepSlot)); }

LossSums LlamaModel::loss_sums() const { return read_sums(kStepSlot); }

void LlamaModel::zero_eval_sums() { ops_.zero(sum_slot(kEvalSlot)); }

void LlamaModel::sft_eval_accumulate(const Batch& batch) {
  sft(batch, 1.0F, false, sum_slot(kEvalSlot));
}

LossSums LlamaModel::eval_sums() const { return read_sums(kEvalSlot); }

void LlamaModel::sft(const Batch& batch, float grad_scale, bool backward, TensorView sums) {
  if (layout_.head() != HeadKind::language_model) {
    throw core::internal_error("SFT pass on a model without a language-model head");
  }
  prepare(batch);
  forward_backbone();
  const ModelConfig& c = config();
  const Workspace& ws = *ws_;
  const std::int64_t n = ws.n;
  const std::int64_t v = c.vocab_size;
  const std::int64_t h = c.hidden_size;
  {
    const core::TraceRange range("lm_head + cross-entropy");
    ops_.lm_head_cross_entropy(
        sums.slice(0, 1), backward ? ws.d_final.slice(0, n * h) : TensorView{},
        backward ? weight_grad(layout_.lm_head(), v * h) : TensorView{},
        ws.final_out.slice(0, n * h), weight(layout_.lm_head(), v * h),
        ws.in().loss_rows.slice(0, ws.counted), ws.in().loss_targets.slice(0, ws.counted), n,
        ws.counted, v, h, grad_scale);
  }
  if (backward) backward_backbone();
}

void LlamaModel::sft_accumulate(const Batch& batch, float grad_scale) {
  sft(batch, grad_scale, true, sum_slot(kStepSlot));
}

kernels::LossSum LlamaModel::sft_forward_backward(const Batch& batch, float grad_scale) {
  ops_.zero(sum_slot(kCallSlot));
  sft(batch, grad_scale, true, sum_slot(kCallSlot));
  return {read_sums(kCallSlot).loss, batch.counted_tokens()};
}

kernels::LossSum LlamaModel::sft_forward(const Batch& batch) {
  ops_.zero(sum_slot(kCallSlot));
  sft(batch, 1.0F, false, sum_slot(kCallSlot));
  return {read_sums(kCallSlot).loss, batch.counted_tokens()};
}

void LlamaModel::reward(const Batch& batch, float grad_scale, double center, bool backward,
                        TensorView sums) {
  if (layout_.head() != HeadKind::reward) {
    throw core::internal_error("reward pass on a model without a score head");
  }
  prepare(batch);
  forward_backbone();
  const ModelConfig& c = config();
  Workspace& ws = *ws_;
  const std::int64_t n = ws.n;
  const std::int64_t h = c.hidden_size;
  const std::int64_t pairs = batch.pairs();
  const std::int64_t count = 2 * pairs;

  ops_.gather_dot(ws.scores.slice(0, count), ws.final_out.slice(0, n * h),
                  weight(layout_.score(), h), ws.in().score_rows.slice(0, count), count, h);
  ops_.bradley_terry(sums, backward ? ws.d_scores.slice(0, count) : TensorView{},
                     ws.scores.slice(0, count),
                     batch.margins.empty() ? TensorView{} : ws.in().margins.slice(0, pairs), pairs,
                     center, grad_scale);
  if (!backward) return;

  ops_.zero(ws.d_final.slice(0, n * h));
  ops_.gather_dot_backward(ws.d_final.slice(0, n * h), weight_grad(layout_.score(), h),
                           ws.d_scores.slice(0, count), ws.final_out.slice(0, n * h),
                           weight(layout_.score(), h), ws.in().score_rows.slice(0, count), count,
                           h);
  backward_backbone();
}

void LlamaModel::reward_accumulate(const Batch& batch, float grad_scale,
                                   double center_coefficient) {
  reward(batch, grad_scale, center_coefficient, true, sum_slot(kStepSlot));
}

RewardOutput LlamaModel::reward_call(const Batch& batch, float grad_scale, double center,
                                     bool backward) {
  ops_.zero(sum_slot(kCallSlot));
  reward(batch, grad_scale, center, backward, sum_slot(kCallSlot));
  const std::int64_t pairs = batch.pairs();
  std::vector<float> scores(static_cast<std::size_t>(2 * pairs));
  ops_.copy(TensorView(std::span<float>(scores)), ws_->scores.slice(0, 2 * pairs));
  const LossSums sums = read_sums(kCallSlot);
  RewardOutput out;
  out.chosen.assign(scores.begin(), scores.begin() + pairs);
  out.rejected.assign(scores.begin() + pairs, scores.end());
  out.stats.loss = sums.loss;
  out.stats.pairs = pairs;
  out.stats.correct = static_cast<std::int64_t>(sums.correct);
  out.stats.margin = sums.margin;
  return out;
}

RewardOutput LlamaModel::reward_forward_backward(const Batch& batch, float grad_scale,
                                                 double center_coefficient) {
  return reward_call(batch, grad_scale, center_coefficient, true);
}

RewardOutput LlamaModel::reward_forward(const Batch& batch, double center_coefficient) {
  return reward_call(batch, 1.0F, center_coefficient, false);
}

std::vector<float> LlamaModel::logits(const Batch& batch) {
  if (layout_.head() != HeadKind::language_model) {
    throw core::internal_error("logits of a model without a language-model head");
  }
  prepare(batch);
  forward_backbone();
  const ModelConfig& c = config();
  const std::int64_t n = ws_->n;
  const Buffer out = ops_.allocate(DType::f32, n * c.vocab_size);
  ops_.matmul(out.view(), ws_->final_out.slice(0, n * c.hidden_size),
              weight(layout_.lm_head(), c.vocab_size * c.hidden_size), n, c.vocab_size,
              c.hidden_size, false);
  std::vector<float> host(static_cast<std::size_t>(n * c.vocab_size));
  ops_.copy(TensorView(std::span<float>(host)), out.view());
  return host;
}

}  // namespace l3::model
