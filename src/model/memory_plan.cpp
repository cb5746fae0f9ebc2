#include "model/memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/carver.hpp"
#include "kernels/cuda/cudnn_attention_sizes.hpp"
#include "kernels/cuda/scratch_sizes.hpp"
#include "model/generation_engine.hpp"
#include "model/llama_model.hpp"
#include "model/tensor_slice.hpp"

namespace l3::model {

namespace {

using kernels::DType;

std::int64_t bytes_of(DType dtype, std::int64_t count) {
  return count * static_cast<std::int64_t>(kernels::dtype_size(dtype));
}

// LlamaModel::prepare's workspace for n tokens, line by line (keep the two in step: the unit
// test compares them).
struct Workspace {
  std::int64_t inputs = 0;      // token ids, counted rows, targets, positions, segments, scores
  std::int64_t residual = 0;    // the residual stream at every layer boundary
  std::int64_t blocks = 0;      // each block's saved activations (one block with recompute)
  std::int64_t backward = 0;    // gradients of activations, scratch
  std::int64_t final_norm = 0;  // the final RMSNorm output and statistics
  std::int64_t rope = 0;        // cos and sin tables
  // Context parallelism: one layer's keys and values of the whole sequence, gathered from the
  // group, and their gradients.
  std::int64_t context = 0;
};

// n: this rank's tokens; whole: the tokens the segments cut (n, or n x C: context parallelism).
Workspace workspace(const ModelConfig& c, DType act, bool recompute, std::int64_t n,
                    std::int64_t seq_len, std::int64_t whole) {
  const std::int64_t h = c.hidden_size;
  const std::int64_t i = c.intermediate_size;
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();
  Workspace w;
  // Two sets of inputs (alternating micro-batches): tokens, positions, counted rows, their
  // targets, score rows; the segment table; margins (at most N / 2 pairs); DPO's sequences'
  // row ranges and reference log-probabilities. Then the scores and their gradients, DPO's
  // per-row losses, their gradients and the sequences' log-probabilities, and the loss sums.
  // (A share's sequences are the whole's: their arrays have the whole's size.)
  const std::int64_t input_set = bytes_of(DType::i32, n) * 4 + bytes_of(DType::i32, whole) +
                                 bytes_of(DType::i32, whole + 1) +
                                 bytes_of(DType::f32, std::max<std::int64_t>(whole / 2, 1)) +
                                 bytes_of(DType::i32, 2 * whole) + bytes_of(DType::f64, whole);
  w.inputs = input_set * 2 + bytes_of(DType::f32, n) * 4 + bytes_of(DType::f64, n) +
             bytes_of(DType::f64, LlamaModel::kLossSumElements);
  w.residual = bytes_of(act, n * h) * (c.n_layers + 1);
  const std::int64_t block = bytes_of(act, n * h) * 3 + bytes_of(DType::f32, n) * 2 +
                             bytes_of(act, n * q) * 2 + bytes_of(act, n * kv) * 2 +
                             bytes_of(DType::f32, n * c.n_heads) + bytes_of(act, n * i) * 3;
  w.blocks = block * (recompute ? 1 : c.n_layers);
  w.final_norm = bytes_of(act, n * h) + bytes_of(DType::f32, n);
  w.backward = bytes_of(act, n * h) * 4 + bytes_of(act, n * q) * 2 + bytes_of(act, n * kv) * 2 +
               bytes_of(act, n * i) * 3;
  w.rope = bytes_of(DType::f32, seq_len * (c.head_dim / 2)) * 2;
  w.context = whole > n ? bytes_of(act, whole * kv) * 4 : 0;
  return w;
}

// The CUDA backend's temporaries: one grow-only buffer sized by the largest op, carved as
// CudaOps carves it (kernels/cuda/cuda_ops.cpp), plus the cuBLASLt workspace.
struct Scratch {
  std::int64_t bytes = 0;
  std::string largest;
};

Scratch cuda_scratch(const ModelConfig& c, std::int64_t n, std::int64_t seq_len,
                     bool fallback_attention) {
  const std::int64_t v = c.vocab_size;
  const std::int64_t h = c.hidden_size;
  // lm_head + cross-entropy, every token counted (the worst case), with the backward: laid
  // out by the function the backend itself uses.
  cuda::Carver lm;
  (void)cuda::carve_lm_head(lm, n, v, h, true);
  // Fallback attention backward for the longest possible segment (a whole row): scores, P,
  // dP, dS of every KV head's group, row dots, fp32 dK and dV of the segment.
  const std::int64_t l = seq_len;
  const std::int64_t squares = c.n_kv_heads * l * l;
  cuda::Carver attention;
  attention.reserve<float>(squares);
  attention.reserve<std::uint16_t>(squares);
  attention.reserve<float>(squares);
  attention.reserve<std::uint16_t>(squares);
  attention.reserve<float>(c.n_heads * l);
  attention.reserve<float>(l * c.kv_size());
  attention.reserve<float>(l * c.kv_size());
  // Converting copies between host and device, a chunk at a time.
  cuda::Carver conversion;
  conversion.reserve<float>(cuda::kCopyChunkElements);
  conversion.reserve<std::uint16_t>(cuda::kCopyChunkElements);

  auto bytes = [](const cuda::Carver& carve) { return static_cast<std::int64_t>(carve.total()); };
  // The embedding's gradient: its own arrays, and CUB's radix sort of n key/position pairs
  // (alternate buffers of 8n bytes and small histograms: 1 MiB allowed for those).
  const auto embedding = static_cast<std::int64_t>(cuda::embedding_backward_own_bytes(n, h)) +
                         8 * n + (std::int64_t{1} << 20U);
  Scratch s{bytes(lm), "lm_head + loss"};
  if (embedding > s.bytes) s = {embedding, "embedding gradient"};
  if (fallback_attention && bytes(attention) > s.bytes)
    s = {bytes(attention), "fallback attention"};
  if (bytes(conversion) > s.bytes) s = {bytes(conversion), "converting copies"};
  return s;
}

}  // namespace

CudnnAttentionBytes cudnn_attention_bytes(const ModelConfig& model, std::int64_t tokens,
                                          std::int64_t seq_len, bool deterministic) {
  // The largest bucket of a micro-batch: as many segments as tokens at most (rounded up), the
  // longest a whole row (rounded up). Realistic packings make smaller ones, but the limit is
  // what a plan can reach (cudnn_attention.cpp refuses plans above it).
  const std::int64_t batch = cuda::cudnn_bucket(tokens, 1);
  cuda::Carver carve;
  (void)cuda::carve_cudnn_backward(carve, tokens, model.n_heads, model.n_kv_heads, model.head_dim,
                                   batch, deterministic);
  CudnnAttentionBytes out;
  out.scratch = static_cast<std::int64_t>(carve.total());
  if (deterministic) {
    const auto limit = static_cast<std::int64_t>(cuda::kCudnnMaxPlanWorkspaceBytes);
    // min() first on the bucket counts: 2 * B * H * S^2 overflows for long rows of many tokens
    const std::int64_t s = cuda::cudnn_bucket(seq_len, cuda::kCudnnMinSeqBucket);
    const std::int64_t per_batch =
        cuda::cudnn_deterministic_workspace_estimate(1, s, model.n_heads);
    const std::int64_t batches_in_limit = limit / std::max<std::int64_t>(per_batch, 1);
    out.over_limit = batch > batches_in_limit;
    out.workspace = out.over_limit ? limit : batch * per_batch;
  }
  return out;
}

std::int64_t MemoryPlan::total() const noexcept {
  std::int64_t sum = 0;
  for (const MemoryLine& line : lines) sum += line.bytes;
  return sum;
}

std::int64_t lora_activation_bytes(const ModelConfig& model, DType compute, bool recompute,
                                   std::int64_t tokens, const LoraConfig& lora) {
  if (!lora.enabled()) return 0;
  int targets = 0;
  for (const LoraTarget t : kLoraTargets) targets += lora.targets_layer(t) ? 1 : 0;
  const std::int64_t blocks = recompute ? 1 : model.n_layers;
  const std::int64_t widest =
      std::max({model.hidden_size, model.q_size(), model.intermediate_size});
  return bytes_of(compute, tokens * lora.rank * (targets * blocks + 1)) +
         (lora.dropout > 0.0 ? bytes_of(compute, tokens * widest) : 0);
}

std::int64_t model_bytes(const ModelConfig& model, HeadKind head, DType compute, bool recompute,
                         std::int64_t tokens, std::int64_t seq_len, bool own_gradients,
                         const LoraConfig& lora, int context_ranks) {
  const std::int64_t params = ParameterLayout(model, head).total();
  const Workspace w =
      workspace(model, compute, recompute, tokens, seq_len, tokens * std::max(context_ranks, 1));
  const std::int64_t activations = w.inputs + w.residual + w.blocks + w.backward + w.final_norm +
                                   w.rope + w.context +
                                   lora_activation_bytes(model, compute, recompute, tokens, lora);
  if (!lora.enabled()) return bytes_of(compute, params) * (own_gradients ? 2 : 1) + activations;
  // The frozen weights once; the adapters and their gradients.
  const std::int64_t adapters = ParameterLayout(model, head, lora).total();
  return bytes_of(compute, params) + bytes_of(compute, adapters) * (own_gradients ? 2 : 1) +
         activations;
}

std::int64_t gradient_slot_elements(const ParameterLayout& layout) {
  const std::vector<FlatRange> groups = layout.gradient_groups();
  const bool tied = layout.lm_head_tied();
  std::int64_t largest = 0;
  for (std::size_t g = tied ? 1 : 0; g < groups.size(); ++g)
    largest = std::max(largest, groups[g].size());
  return 2 * largest + (tied ? groups.front().size() : 0);
}

MemoryPlan plan_training_memory(const MemoryPlanInput& in) {
  // Tensor parallelism: a rank holds a slice of every layer (model/tensor_slice.hpp), which is
  // a model of its own with 1/T of the heads, MLP columns and vocabulary; the residual stream
  // and the norms stay whole.
  const int tp = std::max(in.placement.tensor_parallel, 1);
  const ModelConfig c = tp > 1 ? slice_config(in.model, tp) : in.model;
  const std::int64_t params = ParameterLayout(c, in.head).total();
  // Context parallelism: a rank holds 1/C of each row's tokens and their activations.
  const int cp = std::max(in.placement.context_parallel, 1);
  const std::int64_t whole = in.micro_batch_rows * in.seq_len;
  const std::int64_t n = whole / cp;
  const std::string dtype(kernels::dtype_name(in.compute));
  const Workspace w = workspace(c, in.compute, in.recompute, n, in.seq_len, whole);
  const bool lora = in.lora.enabled();
  const Placement& place = in.placement;
  const int ranks = place.ranks;
  const bool zero3 = place.shards_trained_weights();
  // LoRA with --shard-parameters: the frozen weights are sharded over all ranks and gathered a
  // layer group at a time (parallel/sharded_weights.hpp); the adapters are not.
  const bool frozen_sharded = place.shards_frozen_weights();
  // The ranks the states are sharded over: a shard group (ZeRO-3, hybrid), else all of them.
  const int shards = zero3 ? place.shard_ranks() : place.ranks_per_tensor_rank();
  // Gradients add up in fp32 only where the backend computes in bf16.
  const bool fp32_gradients = in.compute != DType::f32 && place.fp32_gradients;
  // What trains, and so has gradients, master weights and moments: the adapters with LoRA.
  const ParameterLayout layout =
      lora ? ParameterLayout(c, in.head, in.lora) : ParameterLayout(c, in.head);
  const std::int64_t trained = layout.total();
  const std::int64_t owned = place.shards_optimizer() ? (trained + shards - 1) / shards : trained;

  MemoryPlan plan;
  const std::string slice = tp > 1 ? fmt::format(", tensor slice 1/{}", tp) : std::string();
  if (zero3) {
    // In bf16 the fp32 master pieces (below) are the only copy: each rank rounds its pieces to
    // bf16 as it gathers them (parallel/parameter_gather.hpp).
    if (in.compute == DType::f32) {
      plan.lines.push_back({fmt::format("weights ({}, ZeRO-3: 1/{} of {:.3f}B parameters{})", dtype,
                                        shards, static_cast<double>(params) / 1e9, slice),
                            bytes_of(in.compute, owned)});
    }
    plan.lines.push_back({fmt::format("gathered weights ({}, ZeRO-3: two layer groups{})", dtype,
                                      layout.lm_head_tied() ? " and the tied embedding" : ""),
                          bytes_of(in.compute, gradient_slot_elements(layout))});
  } else if (frozen_sharded) {
    const ParameterLayout model_layout(c, in.head);
    plan.lines.push_back({fmt::format("weights ({}, {:.3f}B parameters, frozen, sharded: 1/{})",
                                      dtype, static_cast<double>(params) / 1e9, ranks),
                          bytes_of(in.compute, (params + ranks - 1) / ranks)});
    plan.lines.push_back({fmt::format("gathered frozen weights ({}, two layer groups{})", dtype,
                                      model_layout.lm_head_tied() ? " and the tied embedding" : ""),
                          bytes_of(in.compute, gradient_slot_elements(model_layout))});
  } else {
    plan.lines.push_back(
        {fmt::format("weights ({}, {:.3f}B parameters{}{})", dtype,
                     static_cast<double>(params) / 1e9, lora ? ", frozen" : "", slice),
         bytes_of(in.compute, params)});
  }
  if (lora) {
    plan.lines.push_back(
        {fmt::format("LoRA adapters ({}, rank {}: {:.2f}M parameters{})", dtype, in.lora.rank,
                     static_cast<double>(layout.parameter_count()) / 1e6,
                     in.head == HeadKind::reward ? ", with the score head" : ""),
         bytes_of(in.compute, trained)});
  }
  // In bf16 the fp32 master weights live with the AdamW state (the trainer's shard_master).
  if (in.compute != DType::f32) {
    plan.lines.push_back(
        {zero3 ? fmt::format("master weights (fp32, ZeRO-3: 1/{}, the only copy)", shards)
         : place.shards_optimizer()
             ? fmt::format("master weights (fp32, ZeRO-1: 1/{} of them)", shards)
             : std::string("master weights (fp32, all of them)"),
         bytes_of(DType::f32, owned)});
  }
  if (place.shards_gradients()) {
    plan.lines.push_back(
        {fmt::format("gradients being computed ({}, ZeRO-2: two layer groups{})", dtype,
                     layout.lm_head_tied() ? " and the tied embedding" : ""),
         bytes_of(in.compute, gradient_slot_elements(layout))});
    // In fp32 when micro-batches add up there (Placement::fp32_gradients).
    const DType reduced = fp32_gradients ? DType::f32 : in.compute;
    plan.lines.push_back({fmt::format("reduced gradients ({}, ZeRO-2: 1/{} of them)",
                                      reduced == in.compute ? dtype : std::string("fp32"), shards),
                          bytes_of(reduced, owned)});
  } else {
    const DType gradients = fp32_gradients ? DType::f32 : in.compute;
    plan.lines.push_back(
        {fmt::format("gradients ({}{})", fp32_gradients ? std::string("fp32") : dtype,
                     lora ? ", of the adapters" : ""),
         bytes_of(gradients, trained)});
  }
  plan.lines.push_back({place.shards_optimizer()
                            ? fmt::format("AdamW moments (fp32, ZeRO-1: 1/{} of them)", shards)
                            : std::string("AdamW moments (fp32, all of them)"),
                        bytes_of(DType::f32, owned) * 2});
  plan.lines.push_back(
      {fmt::format("residual stream ({} layer boundaries x {} tokens)", c.n_layers + 1, n),
       w.residual});
  plan.lines.push_back({in.recompute ? std::string("block activations (one block: --recompute)")
                                     : fmt::format("block activations ({} blocks)", c.n_layers),
                        w.blocks});
  plan.lines.push_back({"backward scratch (activation gradients)", w.backward});
  if (lora) {
    plan.lines.push_back(
        {fmt::format("LoRA activations ({} tokens x rank {} per adapter{})", n, in.lora.rank,
                     in.lora.dropout > 0.0 ? ", dropout's input" : ""),
         lora_activation_bytes(c, in.compute, in.recompute, n, in.lora)});
  }
  plan.lines.push_back({"batch inputs, final norm, RoPE tables", w.inputs + w.final_norm + w.rope});
  if (cp > 1) {
    plan.lines.push_back(
        {fmt::format("gathered keys and values ({} tokens, one layer) and gradients", whole),
         w.context});
  }
  if (tp > 1 && in.compute == DType::f32) {
    // The CPU backend's parallel::TensorGroup adds the residual stream's parts after an
    // all-gather into host staging (a GPU's all-reduce works in place).
    plan.lines.push_back(
        {fmt::format("tensor-parallel exchange ({} parts of {} tokens x {})", tp, n, c.hidden_size),
         bytes_of(DType::f32, std::int64_t{tp} * n * c.hidden_size)});
  }
  if (in.compute != DType::f32) {
    // cuDNN where it takes the model's heads (else every call runs on the fallback); the
    // fallback's scratch too where a deterministic plan can go over its workspace limit.
    const bool cudnn = in.attention != AttentionPlan::fallback &&
                       cuda::cudnn_attention_takes_heads(c.n_heads, c.n_kv_heads, c.head_dim);
    const bool deterministic = in.attention == AttentionPlan::cudnn_deterministic;
    const CudnnAttentionBytes own =
        cudnn ? cudnn_attention_bytes(c, n, in.seq_len, deterministic) : CudnnAttentionBytes{};
    const Scratch scratch = cuda_scratch(c, n, in.seq_len, !cudnn || own.over_limit);
    plan.lines.push_back({fmt::format("CUDA scratch ({})", scratch.largest), scratch.bytes});
    if (cudnn && deterministic) {
      plan.lines.push_back(
          {fmt::format("cuDNN attention (deterministic backward): its scratch and cuDNN's dP "
                       "workspace{}",
                       own.over_limit ? " at its 4 GiB limit (larger buckets: the fallback)" : ""),
           own.scratch + own.workspace});
    } else if (cudnn) {
      plan.lines.push_back(
          {"cuDNN attention (non-deterministic backward): its scratch; cuDNN's "
           "own workspace not counted",
           own.scratch});
    }
    plan.lines.push_back(
        {"cuBLASLt workspace", static_cast<std::int64_t>(cuda::kLtWorkspaceBytes)});
  }
  if (in.generation_slots > 0) {
    const EngineMemory e = engine_memory(
        c, in.compute,
        {.slots = static_cast<int>(in.generation_slots), .capacity = in.generation_capacity},
        lora ? in.lora.rank : 0);
    plan.lines.push_back({fmt::format("generation: KV cache of {} sequences x {} positions",
                                      in.generation_slots, in.generation_capacity),
                          e.kv_cache});
    plan.lines.push_back({"generation: the passes' activations and logits", e.workspace});
  }
  for (const MemoryPlanInput::FrozenModel& f : in.frozen_models) {
    const ParameterLayout frozen(f.model, f.head);
    const std::int64_t count = frozen.total();
    if (f.sharded) {
      plan.lines.push_back(
          {fmt::format("{}: weights ({}, {:.3f}B parameters, frozen, sharded: 1/{})", f.what, dtype,
                       static_cast<double>(count) / 1e9, ranks),
           bytes_of(in.compute, (count + ranks - 1) / ranks)});
      plan.lines.push_back(
          {fmt::format("{}: gathered weights ({}, two layer groups{})", f.what, dtype,
                       frozen.lm_head_tied() ? " and the tied embedding" : ""),
           bytes_of(in.compute, gradient_slot_elements(frozen))});
    } else {
      plan.lines.push_back({fmt::format("{}: weights ({}, {:.3f}B parameters, frozen)", f.what,
                                        dtype, static_cast<double>(count) / 1e9),
                            bytes_of(in.compute, count)});
    }
    const Workspace fw = workspace(f.model, in.compute, true, n, in.seq_len, n);
    plan.lines.push_back(
        {fmt::format("{}: a micro-batch's forward pass ({} tokens, one block's activations)",
                     f.what, n),
         fw.inputs + fw.residual + fw.blocks + fw.backward + fw.final_norm + fw.rope});
  }
  return plan;
}

}  // namespace l3::model
