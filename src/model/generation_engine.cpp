#include "model/generation_engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <utility>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace l3::model {

using kernels::ConstTensorView;
using kernels::DType;
using kernels::Shape;
using kernels::TensorView;

namespace {

// Rows [begin, begin + count) of a view whose first dimension is its rows.
TensorView row_range(TensorView x, std::int64_t begin, std::int64_t count) {
  const std::int64_t row = x.row_size();
  return x.slice(begin * row, count * row).reshape(x.shape().with_rows(count));
}

template <typename T>
ConstTensorView host_view(const std::vector<T>& values) {
  return ConstTensorView(std::span<const T>(values));
}

constexpr std::int64_t kDefaultPrefillChunk = 512;

std::int64_t chunk_of(const EngineShape& shape) {
  return shape.prefill_chunk > 0 ? shape.prefill_chunk : kDefaultPrefillChunk;
}

std::int64_t rows_of(const EngineShape& shape) {
  return shape.max_rows > 0 ? shape.max_rows
                            : shape.slots + std::min(shape.capacity, chunk_of(shape));
}

// DecodePath::automatic as $L3_DECODE_GRAPHS says; then what the backend and the model allow.
DecodePath resolve_decode(DecodePath asked, const kernels::Ops& ops, const LlamaModel& model) {
  if (asked == DecodePath::automatic) {
    const char* text = std::getenv("L3_DECODE_GRAPHS");
    if (text == nullptr || *text == '\0' || std::strcmp(text, "1") == 0) {
      asked = DecodePath::graphs;
    } else if (std::strcmp(text, "0") == 0) {
      asked = DecodePath::per_pass;
    } else if (std::strcmp(text, "eager") == 0) {
      asked = DecodePath::bucketed;
    } else {
      throw core::usage_error(
          fmt::format("L3_DECODE_GRAPHS={}: expected 1 (graphs), 0 (none) or eager", text));
    }
  }
  // Pad rows need a backend that skips rows outside the cache; a parameter window may gather
  // each pass's weights into other memory than the recording's.
  if (!ops.can_capture() || model.has_parameter_window()) return DecodePath::per_pass;
  return asked;
}

}  // namespace

std::int64_t decode_bucket(std::int64_t rows, int slots) {
  std::int64_t bucket = 1;
  while (bucket < rows) bucket *= 2;
  return std::min<std::int64_t>(bucket, slots);
}

void validate(const SamplingSettings& settings) {
  if (!std::isfinite(settings.temperature) || settings.temperature < 0.0) {
    throw core::usage_error(
        fmt::format("temperature must be >= 0 (0: greedy), not {}", settings.temperature));
  }
  if (!(settings.top_p > 0.0 && settings.top_p <= 1.0)) {
    throw core::usage_error(fmt::format("top-p must be in (0, 1], not {}", settings.top_p));
  }
  if (settings.top_k < 0) {
    throw core::usage_error(
        fmt::format("top-k must be >= 0 (0: no limit), not {}", settings.top_k));
  }
}

EngineMemory engine_memory(const ModelConfig& c, DType compute, const EngineShape& shape,
                           int lora_rank) {
  const auto act = static_cast<std::int64_t>(kernels::dtype_size(compute));
  const std::int64_t rows = rows_of(shape);
  EngineMemory m;
  m.kv_cache = 2 * std::int64_t{c.n_layers} * shape.slots * shape.capacity * c.kv_size() * act;
  // per row: x, ln, h (H); q, att (q_size); k, v (kv_size); gate, up, act (I); LoRA's u (r x 7)
  const std::int64_t row_values = 3 * c.hidden_size + 2 * c.q_size() + 2 * c.kv_size() +
                                  3 * c.intermediate_size + std::int64_t{lora_rank} * 7;
  // per row: rstd, lse per head (f32); token, position, slot, cu_seqlens (i32)
  const std::int64_t row_bytes = row_values * act + (1 + std::int64_t{c.n_heads}) * 4 + 4 * 4;
  // per slot: the picked row and its norm (H each), its logits (V f32), rstd, the uniform,
  // token and log-probability, the logit row index
  const std::int64_t slot_bytes = 2 * c.hidden_size * act + c.vocab_size * 4 + 4 + 8 + 4 + 4 + 4;
  m.workspace = rows * row_bytes + shape.slots * slot_bytes;
  return m;
}

struct GenerationEngine::Slot {
  bool busy = false;
  GenerationRequest request;
  GenerationOutput output;
  std::int64_t cached = 0;    // positions in the cache
  std::int64_t admitted = 0;  // the order requests came in: the longest waiting prefills first
  std::int32_t pending = -1;  // the latest token, drawn but not yet run (a decoding slot)
  std::int64_t draws = 0;     // tokens drawn for the sequence so far, over all its turns
};

// One pass's rows: the fresh prompt segments first (they attend with the training kernel),
// then the rest (decoding tokens, prompt chunks after a cached prefix).
// What enqueue_pass runs: n rows, the first `fresh` in new prompt segments, m drawing tokens.
struct GenerationEngine::PassShape {
  std::int64_t n = 0;
  std::int64_t fresh = 0;
  std::int64_t m = 0;
  std::span<const std::int32_t> cu_seqlens{};  // of the fresh segments, on the host
  int max_segment = 0;
  int max_keys = 0;                                  // of the other rows
  std::span<const std::int32_t> decode_positions{};  // of the other rows; empty: not checked
  // Decoding rows only: RoPE and the cache write fused (Ops::rope_kv_cache_write).
  bool fused = false;
};

struct GenerationEngine::PassRows {
  std::vector<std::int32_t> tokens, positions, slots;
  std::vector<std::int32_t> cu_seqlens{0};  // of the fresh segments
  std::int64_t fresh = 0;                   // rows in fresh segments
  int max_segment = 0;
  int max_keys = 0;                       // of the other rows
  std::vector<std::int32_t> logit_rows;   // rows whose next token is drawn, ascending
  std::vector<int> logit_slots;           // the slot of each
  std::vector<std::int64_t> prompt_rows;  // prompt tokens run per slot this pass

  [[nodiscard]] std::int64_t size() const noexcept {
    return static_cast<std::int64_t>(tokens.size());
  }
};

GenerationEngine::GenerationEngine(LlamaModel& model, const EngineShape& shape,
                                   SamplingSettings settings)
    : model_(model),
      ops_(model.ops()),
      invariant_ops_(model.ops()),
      shape_(shape),
      settings_(std::move(settings)) {
  const ModelConfig& c = model.config();
  if (model.layout().head() != HeadKind::language_model) {
    throw core::usage_error(
        "generation needs a model with a language-model head, not a reward "
        "model");
  }
  validate(settings_);
  if (shape_.slots < 1 || shape_.capacity < 1) {
    throw core::internal_error(fmt::format("generation engine of {} slots of {} positions",
                                           shape_.slots, shape_.capacity));
  }
  if (shape_.capacity > c.max_position_embeddings) {
    throw core::usage_error(fmt::format(
        "{} positions (prompt + new tokens) exceed the model's max_position_embeddings {}",
        shape_.capacity, c.max_position_embeddings));
  }
  shape_.prefill_chunk = chunk_of(shape_);
  shape_.max_rows = rows_of(shape_);
  shape_.decode = resolve_decode(shape_.decode, ops_, model);
  if (shape_.max_rows < shape_.slots - 1 + std::min(shape_.prefill_chunk, shape_.capacity)) {
    throw core::internal_error(
        fmt::format("generation engine: {} rows per pass for {} slots and chunks of {} tokens",
                    shape_.max_rows, shape_.slots, shape_.prefill_chunk));
  }
  slots_.resize(static_cast<std::size_t>(shape_.slots));
  rope_.ensure(ops_, c, shape_.capacity);

  const DType act = ops_.compute_dtype();
  const auto alloc = [&](DType dtype, const Shape& s) { return kernels::allocate(ops_, dtype, s); };
  // (layers x slots, capacity, n_kv_heads, head_dim): shapes have 4 dimensions at most
  const Shape cache{std::int64_t{c.n_layers} * shape_.slots, shape_.capacity, c.n_kv_heads,
                    c.head_dim};
  k_cache_ = alloc(act, cache);
  v_cache_ = alloc(act, cache);
  const std::int64_t n = shape_.max_rows;
  const std::int64_t s = shape_.slots;
  tokens_ = alloc(DType::i32, n);
  positions_ = alloc(DType::i32, n);
  row_slots_ = alloc(DType::i32, n);
  cu_seqlens_ = alloc(DType::i32, s + 1);
  logit_rows_ = alloc(DType::i32, s);
  x_ = alloc(act, {n, c.hidden_size});
  ln_ = alloc(act, {n, c.hidden_size});
  h_ = alloc(act, {n, c.hidden_size});
  rstd_ = alloc(DType::f32, n);
  q_ = alloc(act, {n, c.n_heads, c.head_dim});
  att_ = alloc(act, {n, c.n_heads, c.head_dim});
  k_ = alloc(act, {n, c.n_kv_heads, c.head_dim});
  v_ = alloc(act, {n, c.n_kv_heads, c.head_dim});
  lse_ = alloc(DType::f32, {c.n_heads, n});
  gate_ = alloc(act, {n, c.intermediate_size});
  up_ = alloc(act, {n, c.intermediate_size});
  act_ = alloc(act, {n, c.intermediate_size});
  if (model.has_adapters()) {
    const LoraConfig& lora = model.options().lora;
    for (const LoraTarget t : kLoraTargets) {
      if (lora.targets_layer(t)) lora_u_[static_cast<std::size_t>(t)] = alloc(act, {n, lora.rank});
    }
  }
  picked_ = alloc(act, {s, c.hidden_size});
  picked_norm_ = alloc(act, {s, c.hidden_size});
  picked_rstd_ = alloc(DType::f32, s);
  logits_ = alloc(DType::f32, {s, c.vocab_size});
  uniforms_ = alloc(DType::f64, s);
  sampled_ = alloc(DType::i32, s);
  sampled_logprobs_ = alloc(DType::f32, s);
}

GenerationEngine::~GenerationEngine() = default;

void GenerationEngine::admit(Slot& slot, GenerationRequest&& request) {
  const ModelConfig& c = model_.config();
  if (request.prompt.empty()) {
    throw core::usage_error("generation needs a prompt of at least one token");
  }
  const auto length = static_cast<std::int64_t>(request.prompt.size());
  if (request.max_new < 0 || length + request.max_new > shape_.capacity) {
    throw core::usage_error(
        fmt::format("a prompt of {} tokens and {} new tokens do not fit in {} positions", length,
                    request.max_new, shape_.capacity));
  }
  for (std::size_t t = 0; t < request.prompt.size(); ++t) {
    if (request.prompt[t] < 0 || request.prompt[t] >= c.vocab_size) {
      throw core::bad_input(
          fmt::format("token id {} at position {} is not below the vocabulary size {}",
                      request.prompt[t], t, c.vocab_size));
    }
  }
  slot.busy = true;
  slot.admitted = admissions_++;
  slot.cached = 0;
  slot.pending = -1;
  slot.draws = 0;
  slot.output = GenerationOutput{.record = request.record, .sample = request.sample};
  slot.request = std::move(request);
}

void GenerationEngine::continue_slot(Slot& slot, Continuation&& next) {
  // The sequence so far: what was prefilled, the turn's tokens and the token it stopped on.
  // Every token but the last drawn one is in the cache (slot.cached).
  std::vector<std::int32_t>& sequence = slot.request.prompt;
  sequence.insert(sequence.end(), slot.output.tokens.begin(), slot.output.tokens.end());
  if (slot.output.stop_token >= 0) sequence.push_back(slot.output.stop_token);
  if (slot.cached + 1 != static_cast<std::int64_t>(sequence.size())) {
    throw core::internal_error(
        fmt::format("generation engine: a turn ended with {} positions cached of {}", slot.cached,
                    sequence.size()));
  }
  const ModelConfig& c = model_.config();
  for (const std::int32_t id : next.tokens) {
    if (id < 0 || id >= c.vocab_size) {
      throw core::bad_input(fmt::format(
          "a continuation's token id {} is not below the vocabulary size {}", id, c.vocab_size));
    }
  }
  const auto length = static_cast<std::int64_t>(sequence.size() + next.tokens.size());
  if (next.max_new < 1 || length + next.max_new > shape_.capacity) {
    throw core::usage_error(
        fmt::format("a sequence of {} tokens and {} new tokens do not fit in {} positions", length,
                    next.max_new, shape_.capacity));
  }
  sequence.insert(sequence.end(), next.tokens.begin(), next.tokens.end());
  slot.request.max_new = next.max_new;
  slot.pending = -1;  // the rest of the sequence is prefilled from slot.cached on
  slot.output = GenerationOutput{.record = slot.request.record, .sample = slot.request.sample};
}

GenerationEngine::PassRows GenerationEngine::plan_pass() {
  PassRows fresh;  // the fresh segments, built here, then the other rows appended
  PassRows other;
  fresh.prompt_rows.assign(slots_.size(), 0);
  std::int64_t budget = shape_.max_rows;
  for (const Slot& slot : slots_) budget -= slot.busy && slot.pending >= 0 ? 1 : 0;
  // Decoding slots, then prompts by arrival: a long prompt waiting for room in the pass is not
  // overtaken forever by later short ones.
  std::vector<std::size_t> order(slots_.size());
  for (std::size_t s = 0; s < order.size(); ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return slots_[a].admitted < slots_[b].admitted;
  });
  for (const std::size_t s : order) {
    const Slot& slot = slots_[s];
    if (!slot.busy) continue;
    const auto sid = static_cast<std::int32_t>(s);
    if (slot.pending >= 0) {  // decoding: one row
      other.tokens.push_back(slot.pending);
      other.positions.push_back(static_cast<std::int32_t>(slot.cached));
      other.slots.push_back(sid);
      other.logit_rows.push_back(static_cast<std::int32_t>(other.size() - 1));
      other.logit_slots.push_back(static_cast<int>(s));
      other.max_keys = std::max(other.max_keys, static_cast<int>(slot.cached + 1));
      continue;
    }
    // The prompt's next chunk, whole or not at all: its rows' arithmetic must not depend on
    // what else runs in the pass.
    const auto length = static_cast<std::int64_t>(slot.request.prompt.size());
    const std::int64_t chunk = std::min(length - slot.cached, shape_.prefill_chunk);
    if (chunk > budget) continue;
    budget -= chunk;
    fresh.prompt_rows[s] = chunk;
    PassRows& into = slot.cached == 0 ? fresh : other;
    for (std::int64_t t = 0; t < chunk; ++t) {
      into.tokens.push_back(slot.request.prompt[static_cast<std::size_t>(slot.cached + t)]);
      into.positions.push_back(static_cast<std::int32_t>(slot.cached + t));
      into.slots.push_back(sid);
    }
    if (slot.cached == 0) {
      fresh.cu_seqlens.push_back(static_cast<std::int32_t>(fresh.size()));
      fresh.max_segment = std::max(fresh.max_segment, static_cast<int>(chunk));
    } else {
      other.max_keys = std::max(other.max_keys, static_cast<int>(slot.cached + chunk));
    }
    if (slot.cached + chunk == length) {  // the prompt is complete: its next token is drawn
      into.logit_rows.push_back(static_cast<std::int32_t>(into.size() - 1));
      into.logit_slots.push_back(static_cast<int>(s));
    }
  }
  // fresh rows, then the others
  fresh.fresh = fresh.size();
  const auto offset = static_cast<std::int32_t>(fresh.fresh);
  fresh.tokens.insert(fresh.tokens.end(), other.tokens.begin(), other.tokens.end());
  fresh.positions.insert(fresh.positions.end(), other.positions.begin(), other.positions.end());
  fresh.slots.insert(fresh.slots.end(), other.slots.begin(), other.slots.end());
  for (std::size_t i = 0; i < other.logit_rows.size(); ++i) {
    fresh.logit_rows.push_back(other.logit_rows[i] + offset);
    fresh.logit_slots.push_back(other.logit_slots[i]);
  }
  fresh.max_keys = other.max_keys;
  // The sampled rows in ascending order (the gather's order does not matter to the results,
  // but a fixed one keeps a pass's work the same whatever the slots' order).
  std::vector<std::size_t> by_row(fresh.logit_rows.size());
  for (std::size_t i = 0; i < by_row.size(); ++i) by_row[i] = i;
  std::sort(by_row.begin(), by_row.end(), [&](std::size_t a, std::size_t b) {
    return fresh.logit_rows[a] < fresh.logit_rows[b];
  });
  PassRows sorted = fresh;
  for (std::size_t i = 0; i < by_row.size(); ++i) {
    sorted.logit_rows[i] = fresh.logit_rows[by_row[i]];
    sorted.logit_slots[i] = fresh.logit_slots[by_row[i]];
  }
  return sorted;
}

std::vector<double> GenerationEngine::uniforms(const std::vector<int>& logit_slots) const {
  std::vector<double> values(logit_slots.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const Slot& slot = slots_[static_cast<std::size_t>(logit_slots[i])];
    const core::CounterRng rng(settings_.seed, core::RngPurpose::sampling,
                               static_cast<std::uint32_t>(slot.request.sample));
    const auto index = static_cast<std::uint64_t>(slot.request.record) << 32U |
                       static_cast<std::uint64_t>(slot.draws);
    values[i] = rng.uniform(index);
  }
  return values;
}

void GenerationEngine::run_pass(const PassRows& rows, std::vector<std::int32_t>& tokens,
                                std::vector<float>& logprobs) {
  const std::int64_t n = rows.size();
  const auto m = static_cast<std::int64_t>(rows.logit_rows.size());
  if (n > 0) {
    ops_.copy(tokens_.first_rows(n), host_view(rows.tokens));
    ops_.copy(positions_.first_rows(n), host_view(rows.positions));
    ops_.copy(row_slots_.first_rows(n), host_view(rows.slots));
    ops_.copy(cu_seqlens_.first_rows(static_cast<std::int64_t>(rows.cu_seqlens.size())),
              host_view(rows.cu_seqlens));
  }
  if (m > 0) {
    ops_.copy(logit_rows_.first_rows(m), host_view(rows.logit_rows));
    ops_.copy(uniforms_.first_rows(m), host_view(uniforms(rows.logit_slots)));
  }
  enqueue_pass({.n = n,
                .fresh = rows.fresh,
                .m = m,
                .cu_seqlens = rows.cu_seqlens,
                .max_segment = rows.max_segment,
                .max_keys = rows.max_keys,
                .decode_positions = std::span<const std::int32_t>(rows.positions)
                                        .subspan(static_cast<std::size_t>(rows.fresh))});
  tokens.assign(static_cast<std::size_t>(m), 0);
  logprobs.assign(static_cast<std::size_t>(m), 0.0F);
  if (m == 0) return;
  ops_.copy(TensorView(std::span<std::int32_t>(tokens)), sampled_.first_rows(m));
  ops_.copy(TensorView(std::span<float>(logprobs)), sampled_logprobs_.first_rows(m));
  ops_.synchronize();
}

void GenerationEngine::run_decode(const PassRows& rows, std::vector<std::int32_t>& tokens,
                                  std::vector<float>& logprobs, bool graphs) {
  const std::int64_t r = rows.size();
  const std::int64_t b = decode_bucket(r, shape_.slots);
  const auto pad = static_cast<std::size_t>(b);
  // Pad rows: token 0 at position 0 of slot -1 (outside the cache: nothing is written or read
  // for them, their attention output is 0), uniform 0; their draws are not read.
  std::vector<std::int32_t> ids = rows.tokens, positions = rows.positions, slots = rows.slots;
  ids.resize(pad, 0);
  positions.resize(pad, 0);
  slots.resize(pad, -1);
  std::vector<std::int32_t> logit_rows(pad);
  std::iota(logit_rows.begin(), logit_rows.end(), 0);  // a decoding pass draws on every row
  std::vector<double> draws = uniforms(rows.logit_slots);
  draws.resize(pad, 0.0);
  ops_.copy(tokens_.first_rows(b), host_view(ids));
  ops_.copy(positions_.first_rows(b), host_view(positions));
  ops_.copy(row_slots_.first_rows(b), host_view(slots));
  ops_.copy(logit_rows_.first_rows(b), host_view(logit_rows));
  ops_.copy(uniforms_.first_rows(b), host_view(draws));
  // Every row against the whole capacity (the last split reaches each row's own position): a
  // plan that holds for every token of the bucket. RoPE and the cache write fused: one launch
  // instead of three per layer.
  const PassShape shape{
      .n = b, .fresh = 0, .m = b, .max_keys = static_cast<int>(shape_.capacity), .fused = true};
  std::unique_ptr<kernels::OpsGraph>& graph = graphs_[b];
  if (graphs && graph && graph->valid()) {
    graph->replay();
    ++graph_replays_;
  } else {
    // The first pass of a bucket (or after the backend replaced memory the graph used) runs
    // op by op, which also sizes the backend's scratch and plans the matmuls; then the same
    // work is recorded for the next passes.
    enqueue_pass(shape);
    if (graphs) {
      graph.reset();
      graph = ops_.capture([&] { enqueue_pass(shape); });
      ++graphs_recorded_;
    }
  }
  tokens.assign(pad, 0);
  logprobs.assign(pad, 0.0F);
  ops_.copy(TensorView(std::span<std::int32_t>(tokens)), sampled_.first_rows(b));
  ops_.copy(TensorView(std::span<float>(logprobs)), sampled_logprobs_.first_rows(b));
  ops_.synchronize();
  tokens.resize(static_cast<std::size_t>(r));
  logprobs.resize(static_cast<std::size_t>(r));
}

void GenerationEngine::enqueue_pass(const PassShape& p) {
  const ModelConfig& c = model_.config();
  const std::int64_t n = p.n;
  const std::int64_t fresh = p.fresh;
  const std::int64_t m = p.m;
  const std::int64_t per_layer = shape_.slots * shape_.capacity * c.kv_size();
  const Shape cache{shape_.slots, shape_.capacity, c.n_kv_heads, c.head_dim};
  const BlockViews block = [&] {
    BlockViews a{.ln1 = ln_.first_rows(n),
                 .rstd1 = rstd_.first_rows(n),
                 .q = q_.first_rows(n),
                 .k = k_.first_rows(n),
                 .v = v_.first_rows(n),
                 .att = att_.first_rows(n),
                 .lse = lse_.first({c.n_heads, n}),
                 .h = h_.first_rows(n),
                 .ln2 = ln_.first_rows(n),  // nothing reads ln1 after the attention half
                 .rstd2 = rstd_.first_rows(n),
                 .gate = gate_.first_rows(n),
                 .up = up_.first_rows(n),
                 .act = act_.first_rows(n)};
    for (std::size_t t = 0; t < lora_u_.size(); ++t) {
      if (lora_u_[t].numel() > 0) a.lora_u[t] = lora_u_[t].first_rows(n);
    }
    return a;
  }();
  const auto attend = [&](int layer) {
    if (n == 0) return;
    const TensorView k_cache = k_cache_.slice(layer * per_layer, per_layer).reshape(cache);
    const TensorView v_cache = v_cache_.slice(layer * per_layer, per_layer).reshape(cache);
    if (p.fused) {
      ops_.rope_kv_cache_write({.q = block.q,
                                .k = block.k,
                                .k_cache = k_cache,
                                .v_cache = v_cache,
                                .v = block.v,
                                .slots = row_slots_.first_rows(n),
                                .positions = positions_.first_rows(n),
                                .cos = rope_.cos(),
                                .sin = rope_.sin()});
    } else {
      ops_.kv_cache_write({.k_cache = k_cache,
                           .v_cache = v_cache,
                           .k = block.k,
                           .v = block.v,
                           .slots = row_slots_.first_rows(n),
                           .positions = positions_.first_rows(n)});
    }
    if (fresh > 0) {
      // The new prompts attend only to themselves: the training kernel on packed segments.
      ops_.attention({.out = row_range(block.att, 0, fresh),
                      .lse = lse_.first({c.n_heads, fresh}),
                      .q = row_range(block.q, 0, fresh),
                      .k = row_range(block.k, 0, fresh),
                      .v = row_range(block.v, 0, fresh),
                      .segments = {.cu_seqlens = cu_seqlens_.first_rows(
                                       static_cast<std::int64_t>(p.cu_seqlens.size())),
                                   .max_segment = p.max_segment,
                                   .host = p.cu_seqlens}});
    }
    if (n > fresh) {
      ops_.decode_attention({.out = row_range(block.att, fresh, n - fresh),
                             .q = row_range(block.q, fresh, n - fresh),
                             .k_cache = k_cache,
                             .v_cache = v_cache,
                             .slots = row_range(row_slots_.view(), fresh, n - fresh),
                             .positions = row_range(positions_.view(), fresh, n - fresh),
                             .max_keys = p.max_keys,
                             .host_positions = p.decode_positions});
    }
  };
  model_.forward_rows({.tokens = tokens_.first_rows(n),
                       .rope = {.positions = positions_.first_rows(n),
                                .cos = rope_.cos(),
                                .sin = rope_.sin(),
                                .in_attend = p.fused},
                       .x = x_.first_rows(n),
                       .block = block,
                       .ops = &invariant_ops_},
                      attend);

  // The rows that draw a token: gathered (an embedding lookup in the pass's rows), normed,
  // and through the lm_head into logits that stay on the backend.
  if (m > 0) {
    ops_.embedding({.out = picked_.first_rows(m),
                    .tokens = logit_rows_.first_rows(m),
                    .table = x_.first_rows(n)});
  }
  model_.final_norm(picked_norm_.first_rows(m), picked_rstd_.first_rows(m), picked_.first_rows(m));
  const HeldGroup held = model_.hold_head(Pass::forward);
  if (m == 0) return;
  ops_.matmul({.y = logits_.first_rows(m),
               .x = picked_norm_.first_rows(m),
               .w = model_.lm_head_weight(),
               .row_invariant = true});
  ops_.sample_tokens({.tokens = sampled_.first_rows(m),
                      .logprobs = sampled_logprobs_.first_rows(m),
                      .logits = logits_.first_rows(m),
                      .uniforms = uniforms_.first_rows(m),
                      .temperature = settings_.temperature,
                      .top_p = settings_.top_p,
                      .top_k = settings_.top_k,
                      .vocab_limit = settings_.vocab_limit,
                      .logprob_scale = settings_.tempered_logprobs
                                           ? kernels::logit_scale(settings_.temperature)
                                           : 1.0F});
}

void GenerationEngine::set_sampling(SamplingSettings settings) {
  validate(settings);
  settings_ = std::move(settings);
  graphs_.clear();  // they hold the sampling settings as kernel arguments
}

void GenerationEngine::run(const RequestSource& next, const OutputSink& done, const StopCheck& stop,
                           const PassAgreement& agree) {
  run_loop(next, done, {}, stop, agree);
}

void GenerationEngine::run_turns(const RequestSource& next, const TurnEnd& turn_end,
                                 const PassAgreement& agree) {
  run_loop(next, {}, turn_end, {}, agree);
}

void GenerationEngine::run_loop(const RequestSource& next, const OutputSink& done,
                                const TurnEnd& turn_end, const StopCheck& stop,
                                const PassAgreement& agree) {
  bool source_empty = false;
  const auto finish = [&](Slot& slot, bool stopped) {
    slot.output.stopped = stopped;
    if (turn_end) {
      GenerationOutput turn = slot.output;  // (continue_slot appends the turn's tokens)
      if (std::optional<Continuation> then = turn_end(std::move(turn))) {
        continue_slot(slot, std::move(*then));
        return;
      }
      slot.busy = false;
      slot.pending = -1;
      return;
    }
    slot.busy = false;
    slot.pending = -1;
    done(std::move(slot.output));
  };
  std::vector<std::int32_t> tokens;
  std::vector<float> logprobs;
  for (;;) {
    // Free slots take the next requests (a request with nothing to generate ends at once).
    for (Slot& slot : slots_) {
      while (!slot.busy && !source_empty) {
        std::optional<GenerationRequest> request = next();
        if (!request) {
          source_empty = true;
          break;
        }
        admit(slot, std::move(*request));
        if (slot.request.max_new == 0) finish(slot, false);
      }
    }
    const PassRows rows = plan_pass();
    const bool work = rows.size() > 0;
    if (agree ? !agree(work) : !work) return;
    // A pass of decoding rows only (no prompt rows) at a bucket's fixed shape, where allowed.
    const bool decoding = work && rows.fresh == 0 &&
                          std::all_of(rows.prompt_rows.begin(), rows.prompt_rows.end(),
                                      [](std::int64_t t) { return t == 0; });
    if (decoding && !agree && shape_.decode != DecodePath::per_pass) {
      run_decode(rows, tokens, logprobs, shape_.decode == DecodePath::graphs);
    } else {
      run_pass(rows, tokens, logprobs);
    }
    // The cache now holds every row run.
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      Slot& slot = slots_[s];
      if (!slot.busy) continue;
      if (slot.pending >= 0) {
        ++slot.cached;
        slot.pending = -1;
      } else {
        slot.cached += rows.prompt_rows[s];
      }
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      Slot& slot = slots_[static_cast<std::size_t>(rows.logit_slots[i])];
      const std::int32_t token = tokens[i];
      ++slot.draws;
      if (std::find(settings_.stop_tokens.begin(), settings_.stop_tokens.end(), token) !=
          settings_.stop_tokens.end()) {
        slot.output.stop_token = token;
        slot.output.stop_logprob = logprobs[i];
        finish(slot, true);
        continue;
      }
      slot.output.tokens.push_back(token);
      slot.output.logprobs.push_back(logprobs[i]);
      if (stop && stop(slot.request, slot.output.tokens)) {
        finish(slot, true);
      } else if (static_cast<std::int64_t>(slot.output.tokens.size()) == slot.request.max_new) {
        finish(slot, false);
      } else {
        slot.pending = token;
      }
    }
  }
}

}  // namespace l3::model
