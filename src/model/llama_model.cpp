#include "model/llama_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/trace_range.hpp"
#include "kernels/idle_ops.hpp"
#include "model/decoder_block.hpp"
#include "model/parameter_init.hpp"
#include "model/rope_table.hpp"

namespace l3::model {

using kernels::Buffer;
using kernels::ConstTensorView;
using kernels::DType;
using kernels::Shape;
using kernels::TensorView;

namespace {

// A host array as a view the backend can copy from.
template <typename T>
ConstTensorView host_view(const std::vector<T>& values) {
  return ConstTensorView(std::span<const T>(values));
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
  std::array<Buffer, kLoraTargetCount> lora_u;  // (N, r) of each adapter: scale * A dropout(x)
};

// A micro-batch's inputs on the backend.
struct InputBuffers {
  Buffer tokens, positions;        // (N)
  Buffer cu_seqlens;               // (segments + 1)
  Buffer loss_rows, loss_targets;  // (C) the counted positions and the tokens they predict
  Buffer score_rows;               // (2P) the chosen, then the rejected last tokens (reward)
  Buffer margins;                  // (P) the pairs' margins (reward)
  Buffer ranges;                   // (2P, 2) each sequence's counted rows [begin, end) (DPO)
  Buffer reference;                // (2P) f64 the reference's log-probabilities (DPO)
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
  std::int64_t sequences = 0;                 // 2P: a preference batch's chosen and rejected
  std::vector<std::int32_t> host_cu_seqlens;  // the same segment table, for the attention
  std::int64_t segment_capacity = 0;          // tokens the segment tables may cut
  // Context parallelism: the current batch is a share of a whole of `whole` tokens in `rows`
  // rows (0: a whole batch); its tokens' indices in the whole (read on the host: the CPU
  // backend's), and the whole's keys and values gathered from the group and their gradients,
  // (whole, n_kv_heads, head_dim), one layer at a time.
  std::int64_t whole = 0;
  std::int64_t rows = 0;
  std::vector<std::int32_t> query_rows;
  // The counted rows' tokens (of the whole, in a share) and each sequence's segment [begin,
  // end) in those tokens: gather_counted_rows' keys.
  std::vector<std::int32_t> counted_tokens;
  std::vector<std::int32_t> sequence_segments;
  std::vector<std::int32_t> sequence_rows;  // a share's row of each sequence's last token, or -1
  std::int64_t context_capacity = 0;
  Buffer k_whole, v_whole, dk_whole, dv_whole;
  RopeBuffers rope;
  // forward
  std::vector<Buffer> layer_inputs;  // n_layers + 1 of (N, H): the residual stream
  std::vector<BlockActivations> blocks;
  Buffer final_out, final_rstd;
  // backward
  Buffer d_resid, d_final, d_ln, d_att, d_q, d_k, d_v, d_act, d_gate, d_up, scratch_out;
  // the objectives' head scratch (HeadInputs): four f32 and one f64 value per row
  std::array<Buffer, 4> head_f32;
  Buffer head_f64;
  // LoRA: an adapter's dropped input (forward) or its input gradient (backward), (N, max in),
  // with dropout only; and d(u) (N, r)
  Buffer lora_x, d_lora;
  // the current micro-batch
  std::int64_t n = 0;
  bool training = false;             // a pass with a backward: LoRA's dropout applies
  kernels::PackedSegments segments;  // its cu_seqlens (this micro-batch's input set)
};

namespace {

// The first n rows of a block's activation buffers (lora_x: the workspace's).
BlockViews block_views(const BlockActivations& b, std::int64_t n, const ModelConfig& c,
                       const Buffer& lora_x) {
  BlockViews views{.ln1 = b.ln1.first_rows(n),
                   .rstd1 = b.rstd1.first_rows(n),
                   .q = b.q.first_rows(n),
                   .k = b.k.first_rows(n),
                   .v = b.v.first_rows(n),
                   .att = b.att.first_rows(n),
                   .lse = b.lse.first({c.n_heads, n}),
                   .h = b.h.first_rows(n),
                   .ln2 = b.ln2.first_rows(n),
                   .rstd2 = b.rstd2.first_rows(n),
                   .gate = b.gate.first_rows(n),
                   .up = b.up.first_rows(n),
                   .act = b.act.first_rows(n)};
  for (std::size_t t = 0; t < b.lora_u.size(); ++t) {
    if (b.lora_u[t].numel() > 0) views.lora_u[t] = b.lora_u[t].first_rows(n);
  }
  views.lora_x = lora_x.view();
  return views;
}

// The largest input of an adapter target: its dropout work buffers' row size.
std::int64_t widest_adapter_input(const ModelConfig& c) {
  return std::max({c.hidden_size, c.q_size(), c.intermediate_size});
}

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, HeadKind head, kernels::Ops& ops,
                       ModelOptions options)
    : whole_config_(config),
      layout_(options.tensor.active() ? slice_config(config, options.tensor.ranks) : config, head),
      adapters_(options.lora.enabled()
                    ? std::optional<ParameterLayout>(std::in_place, config, head, options.lora)
                    : std::nullopt),
      groups_(layout_.gradient_groups()),
      adapter_groups_(adapters_ ? adapters_->gradient_groups() : std::vector<FlatRange>{}),
      ops_(ops),
      options_(options),
      params_(options.own_parameters ? ops.allocate(ops.compute_dtype(), layout_.total())
                                     : Buffer{}),
      adapter_params_(adapters_ ? ops.allocate(ops.compute_dtype(), adapters_->total()) : Buffer{}),
      master_(ops.compute_dtype() == DType::f32 || !options.keep_master
                  ? Buffer{}
                  : ops.allocate(DType::f32, trainable_layout().total())),
      grads_(options.own_gradients
                 ? ops.allocate(options.fp32_gradients ? DType::f32 : ops.compute_dtype(),
                                trainable_layout().total())
                 : Buffer{}),
      sums_(ops.allocate(DType::f64, kLossSumElements)),
      idle_ops_(ops),
      ws_(std::make_unique<Workspace>()) {
  if (options.tensor.active() && adapters_) {
    throw core::internal_error("a tensor-parallel model with LoRA adapters (not built yet)");
  }
}

void LlamaModel::set_tensor_exchange(TensorExchange* exchange) {
  if (exchange != nullptr && exchange->ranks() != options_.tensor.ranks) {
    throw core::internal_error(fmt::format("a tensor group of {} ranks for a model sliced {} ways",
                                           exchange->ranks(), options_.tensor.ranks));
  }
  tensor_ = exchange;
  if (exchange == nullptr || !options_.tensor.active()) {
    vocab_share_ = {};
    return;
  }
  const std::int64_t rows = config().vocab_size;
  vocab_share_ = {
      .slice = {.begin = rows * options_.tensor.rank, .whole = rows * exchange->ranks()},
      .ranks = exchange->ranks(),
      .all_gather = [exchange](std::span<const double> mine, std::span<double> all) {
        exchange->all_gather(mine, all);
      }};
}

TensorReduce LlamaModel::tensor_reduce() {
  if (!options_.tensor.active()) return {};
  if (tensor_ == nullptr) throw core::internal_error("a tensor-parallel pass without its group");
  return [this](TensorView x) {
    pass_ops().synchronize();  // the backend's queue holds x's producer
    tensor_->all_reduce_sum(x);
  };
}

LlamaModel::~LlamaModel() = default;

ConstTensorView LlamaModel::weight(std::int64_t offset, Shape shape) const {
  if (parameter_window_ != nullptr) {
    return parameter_window_->parameters(offset, shape.numel()).reshape(shape);
  }
  require_own_parameters("a pass without a parameter window");
  return params_.slice(offset, shape.numel()).reshape(shape);
}

std::size_t LlamaModel::group_at(std::int64_t offset) const {
  const auto after = std::upper_bound(groups_.begin(), groups_.end(), offset,
                                      [](std::int64_t o, const FlatRange& g) { return o < g.end; });
  if (after == groups_.end() || offset < after->begin) {
    throw core::internal_error(fmt::format("layout position {} is in no gradient group", offset));
  }
  return static_cast<std::size_t>(after - groups_.begin());
}
TensorView LlamaModel::weight_grad(std::int64_t offset, Shape shape) const {
  if (options_.own_gradients) return grads_.slice(offset, shape.numel()).reshape(shape);
  if (window_ == nullptr) {
    throw core::internal_error("a backward pass of a model without gradients or gradient window");
  }
  return window_->gradients(offset, shape.numel()).reshape(shape);
}

void LlamaModel::gradients_ready(std::int64_t offset) {
  if (gradient_ready_) gradient_ready_(offset);
  if (window_ != nullptr && !options_.own_gradients) window_->ready(offset);
}
TensorView LlamaModel::parameter(std::string_view name) const {
  if (adapters_) {
    if (const TensorInfo* t = adapters_->lookup(name)) {
      return adapter_params_.slice(t->offset, t->numel);
    }
  }
  const TensorInfo& t = layout_.find(name);
  return params_.slice(t.offset, t.numel);
}
TensorView LlamaModel::gradient(std::string_view name) const {
  const TensorInfo& t = trainable_layout().find(name);
  return weight_grad(t.offset, Shape(t.numel));
}

std::int64_t LlamaModel::head_ready_offset() const {
  if (!adapters_) return layout_.final_norm();
  return layout_.head() == HeadKind::reward ? adapters_->score() : -1;
}
std::int64_t LlamaModel::block_ready_offset(int layer) const {
  if (!adapters_) return layout_.block(layer).q_proj;  // the block's first tensor
  return adapter_groups_.at(static_cast<std::size_t>(layer)).begin;
}

ConstTensorView LlamaModel::score_weight() const {
  const std::int64_t h = config().hidden_size;
  if (adapters_) return adapter_params_.slice(adapters_->score(), h);
  return weight(layout_.score(), h);
}
TensorView LlamaModel::score_grad() const {
  return weight_grad(adapters_ ? adapters_->score() : layout_.score(), config().hidden_size);
}

BlockAdapters LlamaModel::layer_adapters(int layer) const {
  BlockAdapters ad;
  if (!adapters_ || without_adapters_) return ad;
  const LoraConfig& lora = options_.lora;
  const AdapterOffsets& o = adapters_->adapter(layer);
  const std::int64_t r = lora.rank;
  for (const LoraTarget t : kLoraTargets) {
    const auto k = static_cast<std::size_t>(t);
    if (o.a[k] < 0) continue;
    const auto [out, in] = lora_target_shape(config(), t);
    ad.a[k] = adapter_params_.slice(o.a[k], r * in).reshape({r, in});
    ad.b[k] = adapter_params_.slice(o.b[k], out * r).reshape({out, r});
  }
  ad.scale = lora.scale();
  ad.dropout = ws_->training ? static_cast<float>(lora.dropout) : 0.0F;
  ad.dropout_rng = core::CounterRng(dropout_draw_.seed, core::RngPurpose::lora_dropout,
                                    static_cast<std::uint32_t>(dropout_draw_.step));
  ad.dropout_index = dropout_draw_.first_index(layer);
  return ad;
}

LoraGradients LlamaModel::adapter_grads(int layer, LoraTarget t) const {
  const AdapterOffsets& o = adapters_->adapter(layer);
  const auto k = static_cast<std::size_t>(t);
  const std::int64_t r = options_.lora.rank;
  const auto [out, in] = lora_target_shape(config(), t);
  return {.a = weight_grad(o.a[k], {r, in}), .b = weight_grad(o.b[k], {out, r})};
}

BlockAdapterGradients LlamaModel::layer_adapter_gradients(int layer,
                                                          const BlockAdapters& adapters) const {
  BlockAdapterGradients grads;
  if (!adapters_) return grads;
  for (std::size_t k = 0; k < kLoraTargetCount; ++k) {
    const auto t = static_cast<LoraTarget>(k);
    if (adapters.has(t)) grads.grads[k] = adapter_grads(layer, t);
  }
  grads.du = ws_->d_lora.first_rows(ws_->n);
  grads.scratch = ws_->lora_x.view();
  return grads;
}

BlockGradients LlamaModel::layer_gradients(int layer) const {
  return block_tensors<BlockGradients>(
      layout_, layer,
      [this](std::int64_t offset, const Shape& shape) { return base_grad(offset, shape); });
}

void LlamaModel::require_own_parameters(std::string_view what) const {
  if (!options_.own_parameters) {
    throw core::internal_error(
        fmt::format("{} of a model that holds no parameters (they are sharded)", what));
  }
}

void LlamaModel::initialize(std::uint64_t seed) {
  require_own_parameters("initialize");
  std::vector<float> host(static_cast<std::size_t>(layout_.total()));
  initialize_parameters(host, layout_, seed);
  ops_.copy(params_.view(), host_view(host));  // rounds to the compute dtype
  if (adapters_) {
    initialize_adapters(seed);
  } else if (master_.numel() > 0) {
    ops_.copy(master_.view(), host_view(host));
  }
}

void LlamaModel::initialize_adapters(std::uint64_t seed) {
  load_adapters(initial_adapter_values(seed));
}

std::vector<float> LlamaModel::initial_adapter_values(std::uint64_t seed,
                                                      std::span<const float> score) const {
  if (!adapters_) throw core::internal_error("initial_adapter_values of a model without LoRA");
  std::vector<float> host(static_cast<std::size_t>(adapters_->total()));
  // A purpose of their own: the adapters' tensor i must not draw the model's tensor i's numbers.
  initialize_parameters(host, *adapters_, seed, core::RngPurpose::adapter_init);
  if (layout_.head() == HeadKind::reward) {  // the trained score head starts as the model's
    const std::int64_t h = config().hidden_size;
    const TensorView into(std::span<float>(host).subspan(
        static_cast<std::size_t>(adapters_->score()), static_cast<std::size_t>(h)));
    if (score.empty()) {
      require_own_parameters("initialize_adapters of a reward model");
      ops_.copy(into, params_.slice(layout_.score(), h));
      ops_.synchronize();
    } else {
      if (static_cast<std::int64_t>(score.size()) != h)
        throw core::internal_error("initial_adapter_values: a score head of another size");
      const kernels::Buffer rounded = ops_.allocate(ops_.compute_dtype(), h);
      ops_.copy(rounded.view(), ConstTensorView(score));
      ops_.copy(into, rounded.view());
      ops_.synchronize();  // before `rounded` goes
    }
  }
  return host;
}

void LlamaModel::load_adapters(std::span<const float> host) {
  if (!adapters_) throw core::internal_error("load_adapters of a model without LoRA");
  if (static_cast<std::int64_t>(host.size()) != adapters_->total()) {
    throw core::internal_error(fmt::format("load_adapters: {} values for an adapter layout of {}",
                                           host.size(), adapters_->total()));
  }
  ops_.copy(adapter_params_.view(), ConstTensorView(host));
  if (master_.numel() > 0) ops_.copy(master_.view(), ConstTensorView(host));
}

void LlamaModel::load_parameters(std::span<const float> host) {
  require_own_parameters("load_parameters");
  if (static_cast<std::int64_t>(host.size()) != layout_.total()) {
    throw core::internal_error(
        fmt::format("load_parameters: {} values for a layout of {}", host.size(), layout_.total()));
  }
  ops_.copy(params_.view(), ConstTensorView(host));
  if (!adapters_ && master_.numel() > 0) ops_.copy(master_.view(), ConstTensorView(host));
}

std::vector<float> LlamaModel::master_to_host() const {
  if (!adapters_) require_own_parameters("master_to_host");
  std::vector<float> host(static_cast<std::size_t>(trainable_layout().total()));
  const TensorView master = master_weights();
  ops_.copy(TensorView(std::span<float>(host)), master.empty() ? trainable_parameters() : master);
  ops_.synchronize();
  return host;
}

void LlamaModel::zero_gradients() {
  if (options_.own_gradients) ops_.zero(grads_.view());
}

void LlamaModel::load_batch(const Batch& batch, std::span<const double> reference) {
  const core::TraceRange range("batch upload");
  const ModelConfig& c = config();
  batch.validate(whole_config_.vocab_size);  // ids of the whole vocabulary
  Workspace& ws = *ws_;
  const std::int64_t n = batch.tokens_count();
  const bool share = !batch.context_rows.empty();
  if (share && context_ == nullptr)
    throw core::internal_error("a context-parallel share of a batch without a context group");
  pass_ = n == 0 ? &idle_ops_ : &ops_;  // no rows: the same calls, nothing computed
  const DType act = ops_.compute_dtype();
  // At least one row: a pass over an empty batch (IdleOps) still names its views.
  const std::int64_t segment_cap = std::max<std::int64_t>(batch.whole_tokens(), 1);
  if (const std::int64_t needed = std::max<std::int64_t>(n, 1);
      needed > ws.capacity || segment_cap > ws.segment_capacity) {
    Workspace fresh;
    fresh.capacity = std::max(needed, ws.capacity);
    fresh.segment_capacity = std::max(segment_cap, ws.segment_capacity);
    fresh.context_capacity = 0;  // allocated below when a share needs them
    auto alloc = [&](DType dtype, const Shape& shape) {
      return kernels::allocate(ops_, dtype, shape);
    };
    const std::int64_t cap = fresh.capacity;
    const Shape hidden{cap, c.hidden_size};               // (N, H)
    const Shape heads{cap, c.n_heads, c.head_dim};        // (N, n_heads, head_dim)
    const Shape kv_heads{cap, c.n_kv_heads, c.head_dim};  // (N, n_kv_heads, head_dim)
    const Shape intermediate{cap, c.intermediate_size};   // (N, I)
    for (InputBuffers& set : fresh.input_sets) {
      // A sequence has a token at least: 2P <= the tokens the segments cut (a share's
      // sequences are the whole's).
      const std::int64_t whole = fresh.segment_capacity;
      set = {alloc(DType::i32, cap),
             alloc(DType::i32, cap),
             alloc(DType::i32, whole + 1),
             alloc(DType::i32, cap),
             alloc(DType::i32, cap),
             alloc(DType::i32, whole),
             alloc(DType::f32, std::max<std::int64_t>(whole / 2, 1)),
             alloc(DType::i32, 2 * whole),
             alloc(DType::f64, whole)};
    }
    for (Buffer& b : fresh.head_f32) b = alloc(DType::f32, cap);
    fresh.head_f64 = alloc(DType::f64, cap);
    fresh.current = ws.current;
    for (int l = 0; l <= c.n_layers; ++l) fresh.layer_inputs.push_back(alloc(act, hidden));
    const int slots = options_.recompute ? 1 : c.n_layers;
    for (int s = 0; s < slots; ++s) {
      fresh.blocks.push_back({alloc(act, hidden), alloc(DType::f32, cap), alloc(act, heads),
                              alloc(act, kv_heads), alloc(act, kv_heads), alloc(act, heads),
                              alloc(DType::f32, {c.n_heads, cap}), alloc(act, hidden),
                              alloc(act, hidden), alloc(DType::f32, cap), alloc(act, intermediate),
                              alloc(act, intermediate), alloc(act, intermediate)});
      if (!adapters_) continue;
      for (const LoraTarget t : kLoraTargets) {
        if (options_.lora.targets_layer(t)) {
          fresh.blocks.back().lora_u[static_cast<std::size_t>(t)] =
              alloc(act, {cap, options_.lora.rank});
        }
      }
    }
    if (adapters_) {
      fresh.d_lora = alloc(act, {cap, options_.lora.rank});
      if (options_.lora.dropout > 0.0) fresh.lora_x = alloc(act, cap * widest_adapter_input(c));
    }
    fresh.final_out = alloc(act, hidden);
    fresh.final_rstd = alloc(DType::f32, cap);
    fresh.d_resid = alloc(act, hidden);
    fresh.d_final = alloc(act, hidden);
    fresh.d_ln = alloc(act, hidden);
    fresh.d_att = alloc(act, heads);
    fresh.d_q = alloc(act, heads);
    fresh.d_k = alloc(act, kv_heads);
    fresh.d_v = alloc(act, kv_heads);
    fresh.d_act = alloc(act, intermediate);
    fresh.d_gate = alloc(act, intermediate);
    fresh.d_up = alloc(act, intermediate);
    fresh.scratch_out = alloc(act, hidden);
    fresh.rope = std::move(ws.rope);
    ws = std::move(fresh);
  }
  ws.whole = share ? batch.whole_tokens() : 0;
  ws.rows = batch.rows;
  ws.query_rows.assign(batch.context_rows.begin(), batch.context_rows.end());
  if (share && ws.whole > ws.context_capacity) {
    const Shape kv_whole{ws.whole, c.n_kv_heads, c.head_dim};  // (whole, n_kv_heads, head_dim)
    ws.k_whole = kernels::allocate(ops_, act, kv_whole);
    ws.v_whole = kernels::allocate(ops_, act, kv_whole);
    ws.dk_whole = kernels::allocate(ops_, act, kv_whole);
    ws.dv_whole = kernels::allocate(ops_, act, kv_whole);
    ws.context_capacity = ws.whole;
  }
  // RoPE positions restart in each segment: a packed row (GRPO's completions end to end,
  // BatchBuilder::finish_packed) may be longer than the model's positions, its segments not.
  if (const std::int64_t longest = batch.longest_segment(); longest > c.max_position_embeddings) {
    throw core::usage_error(
        fmt::format("sequence length {} exceeds the model's max_position_embeddings {}", longest,
                    c.max_position_embeddings));
  }
  const std::int64_t row_tokens = share ? ws.whole / batch.rows : batch.seq_len;  // the whole's
  ws.rope.ensure(ops_, c, std::min<std::int64_t>(row_tokens, c.max_position_embeddings));

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
  // The counted rows' tokens in the segmented sequence: the rows themselves, or in a share their
  // tokens of the whole (ascending too).
  ws.counted_tokens = rows;
  if (share) {
    for (std::int32_t& t : ws.counted_tokens) t = batch.context_rows[static_cast<std::size_t>(t)];
  }
  std::vector<std::int32_t> score_rows(batch.chosen_last);  // chosen, then rejected
  score_rows.insert(score_rows.end(), batch.rejected_last.begin(), batch.rejected_last.end());
  ws.sequences = static_cast<std::int64_t>(score_rows.size());
  // A share holds each sequence's last token or not: its row here, or -1.
  ws.sequence_rows.clear();
  if (share) {
    for (const std::int32_t last : score_rows) {
      const auto at = std::lower_bound(batch.context_rows.begin(), batch.context_rows.end(), last);
      ws.sequence_rows.push_back(at != batch.context_rows.end() && *at == last
                                     ? static_cast<std::int32_t>(at - batch.context_rows.begin())
                                     : -1);
    }
  }
  // Each sequence's counted rows: those of the segment that ends with its last token (its own:
  // a document is a segment), a contiguous run of the ascending `rows` (a share's of them).
  std::vector<std::int32_t> ranges;
  ranges.reserve(2 * score_rows.size());
  ws.sequence_segments.clear();
  for (const std::int32_t last : score_rows) {
    const auto end_it = std::upper_bound(batch.cu_seqlens.begin(), batch.cu_seqlens.end(), last);
    if (end_it == batch.cu_seqlens.begin() || end_it == batch.cu_seqlens.end())
      throw core::internal_error(fmt::format("a sequence's last token {} is in no segment", last));
    const std::int32_t begin = *(end_it - 1);
    const std::int32_t end = *end_it;
    const auto& tokens = ws.counted_tokens;
    ranges.push_back(static_cast<std::int32_t>(
        std::lower_bound(tokens.begin(), tokens.end(), begin) - tokens.begin()));
    ranges.push_back(static_cast<std::int32_t>(std::lower_bound(tokens.begin(), tokens.end(), end) -
                                               tokens.begin()));
    ws.sequence_segments.push_back(begin);
    ws.sequence_segments.push_back(end);
  }
  if (!reference.empty() && reference.size() != score_rows.size()) {
    throw core::internal_error(fmt::format("{} reference log-probabilities for {} sequences",
                                           reference.size(), score_rows.size()));
  }
  const std::vector<double> reference_values(reference.begin(), reference.end());

  // Alternate the input sets between the batches that upload: a batch of no rows uploads
  // nothing, and must not make the next one copy into the set the last one still reads.
  if (n > 0) ws.current = 1 - ws.current;
  const InputBuffers& in = ws.in();
  auto upload = [](const Buffer& dst, const auto& host) {
    return kernels::HostUpload{dst.slice(0, static_cast<std::int64_t>(host.size())),
                               host_view(host)};
  };
  const std::array<kernels::HostUpload, 9> uploads{
      upload(in.tokens, batch.tokens),         upload(in.positions, batch.positions),
      upload(in.cu_seqlens, batch.cu_seqlens), upload(in.loss_rows, rows),
      upload(in.loss_targets, targets),        upload(in.score_rows, score_rows),
      upload(in.margins, batch.margins),       upload(in.ranges, ranges),
      upload(in.reference, reference_values)};
  pass_ops().upload_inputs(ws.current, uploads);
  ws.host_cu_seqlens.assign(batch.cu_seqlens.begin(), batch.cu_seqlens.end());
  ws.segments = {.cu_seqlens = in.cu_seqlens.first_rows(batch.segments() + 1),
                 .max_segment = static_cast<int>(batch.longest_segment()),
                 .host = ws.host_cu_seqlens};
}

LlamaModel::WholeKeys LlamaModel::gather_whole_keys(const BlockViews& a) {
  Workspace& ws = *ws_;
  const WholeKeys whole{
      .k = ws.k_whole.first_rows(ws.whole),
      .v = ws.v_whole.first_rows(ws.whole),
      .query_rows = ConstTensorView(std::span<const std::int32_t>(ws.query_rows))};
  context_->all_gather(a.k, whole.k, ws.rows);
  context_->all_gather(a.v, whole.v, ws.rows);
  return whole;
}

void LlamaModel::attention_share(const BlockViews& a) {
  // This rank's queries against the whole sequence's keys and values.
  const WholeKeys whole = gather_whole_keys(a);
  pass_ops().attention({.out = a.att,
                        .lse = a.lse,
                        .q = a.q,
                        .k = whole.k,
                        .v = whole.v,
                        .segments = ws_->segments,
                        .query_rows = whole.query_rows});
}

void LlamaModel::attention_backward_share(const BlockViews& a) {
  Workspace& ws = *ws_;
  const std::int64_t n = ws.n;
  // The whole's keys and values again (not kept from the forward), the gradients of every key
  // and value from this rank's queries, and their sums over the group at this rank's tokens.
  const WholeKeys whole = gather_whole_keys(a);
  const TensorView dk_whole = ws.dk_whole.first_rows(ws.whole);
  const TensorView dv_whole = ws.dv_whole.first_rows(ws.whole);
  pass_ops().attention_backward({.dq = ws.d_q.first_rows(n),
                                 .dk = dk_whole,
                                 .dv = dv_whole,
                                 .dout = ws.d_att.first_rows(n),
                                 .out = a.att,
                                 .lse = a.lse,
                                 .q = a.q,
                                 .k = whole.k,
                                 .v = whole.v,
                                 .segments = ws.segments,
                                 .query_rows = whole.query_rows});
  context_->reduce_scatter(dk_whole, ws.d_k.first_rows(n), ws.rows);
  context_->reduce_scatter(dv_whole, ws.d_v.first_rows(n), ws.rows);
}

void LlamaModel::forward_backbone() {
  const ModelConfig& c = config();
  Workspace& ws = *ws_;
  const std::int64_t n = ws.n;
  const std::int64_t h = c.hidden_size;
  {
    const core::TraceRange range("embedding");
    const HeldGroup held = hold(layout_.embedding(), Pass::forward);
    pass_ops().embedding({.out = ws.layer_inputs[0].first_rows(n),
                          .tokens = ws.in().tokens.first_rows(n),
                          .table = weight(layout_.embedding(), {c.vocab_size, h}),
                          .vocab = vocab_slice()});
    // tensor parallelism: each token's row is one rank's, zeros elsewhere
    if (const TensorReduce reduce = tensor_reduce()) reduce(ws.layer_inputs[0].first_rows(n));
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const HeldGroup held = hold(layout_.block(l).q_proj, Pass::forward);
    block_forward(l, ws.layer_inputs[static_cast<std::size_t>(l)].first_rows(n),
                  ws.layer_inputs[static_cast<std::size_t>(l) + 1].first_rows(n),
                  options_.recompute ? 0 : l);
  }
  const HeldGroup held = hold(layout_.final_norm(), Pass::forward);
  pass_ops().rmsnorm({.out = ws.final_out.first_rows(n),
                      .rstd = ws.final_rstd.first_rows(n),
                      .x = ws.layer_inputs.back().first_rows(n),
                      .w = weight(layout_.final_norm(), h),
                      .eps = static_cast<float>(c.rms_norm_eps)});
}

BlockWeights LlamaModel::layer_weights(int layer) const {
  return block_weights(layout_, layer, [this](std::int64_t offset, const Shape& shape) {
    return weight(offset, shape);
  });
}

void LlamaModel::block_forward(int layer, ConstTensorView x_in, TensorView x_out, int slot) {
  const core::TraceRange range("block {} forward", layer);
  const ModelConfig& c = config();
  Workspace& ws = *ws_;
  const BlockViews a = block_views(ws.blocks[static_cast<std::size_t>(slot)], ws.n, c, ws.lora_x);
  const BlockAdapters adapters = layer_adapters(layer);
  decoder_block_forward(
      pass_ops(), c, layer_weights(layer),
      {.positions = ws.in().positions.first_rows(ws.n), .cos = ws.rope.cos(), .sin = ws.rope.sin()},
      x_in, x_out, a,
      [&] {
        if (ws.whole == 0) {
          pass_ops().attention(
              {.out = a.att, .lse = a.lse, .q = a.q, .k = a.k, .v = a.v, .segments = ws.segments});
          return;
        }
        attention_share(a);
      },
      adapters_ ? &adapters : nullptr, tensor_reduce());
}

void LlamaModel::backward_backbone() {
  const ModelConfig& c = config();
  Workspace& ws = *ws_;
  const std::int64_t n = ws.n;
  const std::int64_t h = c.hidden_size;
  const TensorView d_resid = ws.d_resid.first_rows(n);  // d(loss)/d(residual stream)
  const ConstTensorView positions = ws.in().positions.first_rows(n);

  pass_ops().zero(d_resid);
  const TensorReduce reduce = tensor_reduce();
  // tensor parallelism: the lm_head's slices each gave a part of d(final norm output)
  if (reduce && layout_.head() == HeadKind::language_model) reduce(ws.d_final.first_rows(n));
  {
    const HeldGroup held = hold(layout_.final_norm(), Pass::backward);
    pass_ops().rmsnorm_backward({.dx = d_resid,
                                 .dw = base_grad(layout_.final_norm(), h),
                                 .dout = ws.d_final.first_rows(n),
                                 .x = ws.layer_inputs.back().first_rows(n),
                                 .w = weight(layout_.final_norm(), h),
                                 .rstd = ws.final_rstd.first_rows(n)});
  }
  // the head after it (a LoRA language model trains nothing there)
  if (const std::int64_t head = head_ready_offset(); head >= 0) gradients_ready(head);

  for (int l = c.n_layers - 1; l >= 0; --l) {
    const core::TraceRange range("block {} backward", l);
    const HeldGroup held = hold(layout_.block(l).q_proj, Pass::backward);
    const TensorView x_in = ws.layer_inputs[static_cast<std::size_t>(l)].first_rows(n);
    const int slot = options_.recompute ? 0 : l;
    if (options_.recompute) block_forward(l, x_in, ws.scratch_out.first_rows(n), slot);
    const BlockViews a = block_views(ws.blocks[static_cast<std::size_t>(slot)], n, c, ws.lora_x);
    const BlockAdapters ad = layer_adapters(l);
    const BlockAdapterGradients adapter_grads = layer_adapter_gradients(l, ad);
    decoder_block_backward(
        pass_ops(), c, layer_weights(l), layer_gradients(l),  // read within the held group
        {.positions = positions, .cos = ws.rope.cos(), .sin = ws.rope.sin()}, x_in, d_resid, a,
        {.d_ln = ws.d_ln.first_rows(n),
         .d_act = ws.d_act.first_rows(n),
         .d_gate = ws.d_gate.first_rows(n),
         .d_up = ws.d_up.first_rows(n),
         .d_att = ws.d_att.first_rows(n),
         .d_q = ws.d_q.first_rows(n),
         .d_k = ws.d_k.first_rows(n),
         .d_v = ws.d_v.first_rows(n)},
        [&] {
          if (ws.whole > 0) {
            attention_backward_share(a);
            return;
          }
          pass_ops().attention_backward({.dq = ws.d_q.first_rows(n),
                                         .dk = ws.d_k.first_rows(n),
                                         .dv = ws.d_v.first_rows(n),
                                         .dout = ws.d_att.first_rows(n),
                                         .out = a.att,
                                         .lse = a.lse,
                                         .q = a.q,
                                         .k = a.k,
                                         .v = a.v,
                                         .segments = ws.segments});
        },
        adapters_ ? &ad : nullptr, adapters_ ? &adapter_grads : nullptr, reduce);
    gradients_ready(block_ready_offset(l));
  }
  if (adapters_) return;  // a frozen embedding: nothing to compute or report
  const core::TraceRange range("embedding backward");
  pass_ops().embedding_backward({.dtable = weight_grad(layout_.embedding(), {c.vocab_size, h}),
                                 .tokens = ws.in().tokens.first_rows(n),
                                 .dout = d_resid,
                                 .vocab = vocab_slice()});
  gradients_ready(0);
}

void LlamaModel::forward(const PassOptions& options) {
  ws_->training = options.training;
  without_adapters_ = !options.adapters;
  try {
    forward_backbone();
  } catch (...) {
    without_adapters_ = false;
    throw;
  }
  without_adapters_ = false;
}

void LlamaModel::backward() { backward_backbone(); }

HeadInputs LlamaModel::head() const {
  const Workspace& ws = *ws_;
  const InputBuffers& in = ws.in();
  const std::int64_t sequences = ws.sequences;
  return {.counted = ws.counted,
          .sequences = sequences,
          .hidden = ws.final_out.first_rows(ws.n),
          .d_hidden = ws.d_final.first_rows(ws.n),
          .loss_rows = in.loss_rows.first_rows(ws.counted),
          .loss_targets = in.loss_targets.first_rows(ws.counted),
          .score_rows = in.score_rows.first_rows(sequences),
          .margins = in.margins.first_rows(sequences / 2),
          .ranges = in.ranges.first(Shape{sequences, 2}),
          .reference = in.reference.first_rows(sequences),
          .row_f32 = {ws.head_f32[0].first_rows(ws.n), ws.head_f32[1].first_rows(ws.n),
                      ws.head_f32[2].first_rows(ws.n), ws.head_f32[3].first_rows(ws.n)},
          .row_f64 = ws.head_f64.first_rows(ws.n)};
}

TensorView LlamaModel::sums(SumSlot slot) const {
  return sums_.slice(static_cast<std::int64_t>(slot) * kSumValues, kSumValues);
}

void LlamaModel::zero_sums(SumSlot slot) { ops_.zero(sums(slot)); }

std::array<double, LlamaModel::kSumValues> LlamaModel::read_sums(SumSlot slot) const {
  std::array<double, kSumValues> host{};
  ops_.copy(TensorView(std::span<double>(host)), sums(slot));
  return host;
}

HeldGroup LlamaModel::hold_head(Pass pass) const {
  return hold(layout_.head() == HeadKind::language_model ? layout_.lm_head() : layout_.score(),
              pass);
}

ConstTensorView LlamaModel::lm_head_weight() const {
  return weight(layout_.lm_head(), {config().vocab_size, config().hidden_size});
}

TensorView LlamaModel::lm_head_grad() const {
  return base_grad(layout_.lm_head(), {config().vocab_size, config().hidden_size});
}

void LlamaModel::forward_rows(const RowPass& pass, const std::function<void(int layer)>& attend) {
  const ModelConfig& c = config();
  const std::int64_t n = pass.x.rows();
  if (options_.tensor.active()) {
    throw core::internal_error("generation on a tensor-parallel model (not built yet)");
  }
  kernels::Ops& ops =
      n == 0 ? static_cast<kernels::Ops&>(idle_ops_) : (pass.ops != nullptr ? *pass.ops : ops_);
  {
    const HeldGroup held = hold(layout_.embedding(), Pass::forward);
    ops.embedding({.out = pass.x,
                   .tokens = pass.tokens,
                   .table = weight(layout_.embedding(), {c.vocab_size, c.hidden_size})});
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const core::TraceRange range("block {} generation", l);
    const HeldGroup held = hold(layout_.block(l).q_proj, Pass::forward);
    BlockAdapters adapters = layer_adapters(l);
    adapters.dropout = 0.0F;  // generation, never training
    decoder_block_forward(
        ops, c, layer_weights(l), pass.rope, pass.x, pass.x, pass.block, [&] { attend(l); },
        adapters_ ? &adapters : nullptr);
  }
}

void LlamaModel::final_norm(TensorView out, TensorView rstd, ConstTensorView x) {
  kernels::Ops& ops = x.rows() == 0 ? static_cast<kernels::Ops&>(idle_ops_) : ops_;
  const HeldGroup held = hold(layout_.final_norm(), Pass::forward);
  ops.rmsnorm({.out = out,
               .rstd = rstd,
               .x = x,
               .w = weight(layout_.final_norm(), config().hidden_size),
               .eps = static_cast<float>(config().rms_norm_eps)});
}

bool LlamaModel::holds_share() const noexcept { return ws_->whole > 0; }

std::span<const std::int32_t> LlamaModel::share_sequence_rows() const noexcept {
  return ws_->sequence_rows;
}

ContextExchange& LlamaModel::context_exchange() const {
  if (context_ == nullptr) throw core::internal_error("a model without a context group");
  return *context_;
}

LlamaModel::WholeRows LlamaModel::gather_counted_rows(ConstTensorView local) const {
  const Workspace& ws = *ws_;
  if (ws.whole == 0 || context_ == nullptr)
    throw core::internal_error("gather_counted_rows: the loaded batch is not a share");
  std::vector<float> mine(static_cast<std::size_t>(ws.counted));
  pass_ops().copy(TensorView(std::span<float>(mine)), local);
  pass_ops().synchronize();
  const std::vector<std::int32_t> tokens =
      context_->all_gather_varying(std::span<const std::int32_t>(ws.counted_tokens));
  const std::vector<float> values = context_->all_gather_varying(std::span<const float>(mine));
  // Every counted token is one rank's: sorting by token puts the rows in the whole's order.
  std::vector<std::size_t> order(tokens.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return tokens[a] < tokens[b]; });
  std::vector<std::int32_t> sorted(tokens.size());
  WholeRows out;
  out.values.resize(values.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    sorted[k] = tokens[order[k]];
    out.values[k] = values[order[k]];
  }
  const auto position = [&](std::int32_t token) {
    return static_cast<std::int32_t>(std::lower_bound(sorted.begin(), sorted.end(), token) -
                                     sorted.begin());
  };
  for (const std::int32_t t : ws.counted_tokens) out.mine.push_back(position(t));
  for (const std::int32_t bound : ws.sequence_segments) out.ranges.push_back(position(bound));
  return out;
}

std::vector<float> LlamaModel::target_log_probs(const Batch& batch, float logit_scale,
                                                bool adapters) {
  if (layout_.head() != HeadKind::language_model) {
    throw core::internal_error("log-probabilities of a model without a language-model head");
  }
  load_batch(batch);
  forward({.training = false, .adapters = adapters});
  const HeadInputs in = head();
  const TensorView rows = in.row_f32[0].first_rows(in.counted);  // each row's cross-entropy
  {
    const HeldGroup held = hold_head(Pass::forward);
    pass_ops().lm_head_cross_entropy({.row_loss = rows,
                                      .h = in.hidden,
                                      .w = lm_head_weight(),
                                      .rows = in.loss_rows,
                                      .targets = in.loss_targets,
                                      .logit_scale = logit_scale,
                                      .vocab = vocab_share()});
  }
  std::vector<float> out(static_cast<std::size_t>(in.counted));
  pass_ops().copy(TensorView(std::span<float>(out)), rows);
  pass_ops().synchronize();
  for (float& v : out) v = -v;
  return out;
}

std::vector<float> LlamaModel::logits(const Batch& batch) {
  if (layout_.head() != HeadKind::language_model) {
    throw core::internal_error("logits of a model without a language-model head");
  }
  if (options_.tensor.active()) throw core::internal_error("whole logits of a vocabulary slice");
  load_batch(batch);
  ws_->training = false;
  forward_backbone();
  const ModelConfig& c = config();
  const std::int64_t n = ws_->n;
  const Buffer out = kernels::allocate(ops_, DType::f32, {n, c.vocab_size});
  const HeldGroup held = hold(layout_.lm_head(), Pass::forward);
  ops_.matmul({.y = out.view(),
               .x = ws_->final_out.first_rows(n),
               .w = weight(layout_.lm_head(), {c.vocab_size, c.hidden_size})});
  std::vector<float> host(static_cast<std::size_t>(n * c.vocab_size));
  ops_.copy(TensorView(std::span<float>(host)), out.view());
  return host;
}

}  // namespace l3::model
