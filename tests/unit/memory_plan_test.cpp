// The memory plan (model/memory_plan) against what the model really allocates on the CPU
// backend, with and without recomputation, and its arithmetic for a GPU-shaped configuration.
#include "model/memory_plan.hpp"

#include <fmt/format.h>

#include <string>

#include "catch.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/batch.hpp"
#include "model/llama_model.hpp"
#include "train/objectives/language_model_loss.hpp"

using l3::kernels::DType;
using l3::model::HeadKind;

namespace {

l3::model::Batch reversal_batch(std::int64_t rows, std::int64_t seq_len) {
  l3::model::BatchBuilder builder(rows, seq_len, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::vector<std::int32_t> tokens{5, 6, 7, 8, 9, 10};
    const std::vector<std::uint8_t> mask{0, 0, 0, 1, 1, 1};
    REQUIRE(builder.add(tokens, mask) >= 0);
    builder.end_row();
  }
  return builder.finish();
}

}  // namespace

TEST_CASE("the memory plan is what the model allocates for a step", "[memory]") {
  for (const bool recompute : {false, true}) {
    INFO("recompute " << recompute);
    l3::kernels::CpuOps ops;
    const l3::model::ModelConfig config = l3::model::preset("tiny");
    l3::model::LlamaModel model(config, HeadKind::language_model, ops, {.recompute = recompute});
    const std::int64_t rows = 3;
    const std::int64_t seq_len = 32;
    (void)l3::train::LanguageModelLoss(model).forward_backward(reversal_batch(rows, seq_len), 1.0F);
    CHECK(ops.allocated_bytes() == l3::model::model_bytes(config, HeadKind::language_model,
                                                          DType::f32, recompute, rows * seq_len,
                                                          seq_len));
    // A second step of the same shape allocates nothing more.
    const std::int64_t after_first = ops.allocated_bytes();
    (void)l3::train::LanguageModelLoss(model).forward_backward(reversal_batch(rows, seq_len), 1.0F);
    CHECK(ops.allocated_bytes() == after_first);
  }
}

TEST_CASE("without its own gradients (ZeRO-2) the model allocates no gradient buffer", "[memory]") {
  l3::kernels::CpuOps ops;
  const l3::model::ModelConfig config = l3::model::preset("tiny");
  const l3::model::LlamaModel model(config, HeadKind::language_model, ops,
                                    {.own_gradients = false});
  CHECK(model.gradients().empty());
  const std::int64_t params = model.layout().total();
  CHECK(ops.allocated_bytes() == 4 * params + 8 * l3::model::LlamaModel::kLossSumElements);
  CHECK(l3::model::model_bytes(config, HeadKind::language_model, DType::f32, false, 96, 32) -
            l3::model::model_bytes(config, HeadKind::language_model, DType::f32, false, 96, 32,
                                   false) ==
        4 * params);
}

TEST_CASE("gradient groups tile the layout where the backward reports them", "[memory]") {
  for (const bool tied : {false, true}) {
    INFO("tied " << tied);
    l3::model::ModelConfig config = l3::model::preset("tiny");
    config.tie_word_embeddings = tied;
    const l3::model::ParameterLayout layout(config, HeadKind::language_model);
    const auto groups = layout.gradient_groups();
    REQUIRE(groups.size() == static_cast<std::size_t>(config.n_layers) + 2);
    CHECK(groups.front().begin == 0);
    CHECK(groups.back().end == layout.total());
    for (std::size_t g = 1; g < groups.size(); ++g) CHECK(groups[g].begin == groups[g - 1].end);
    CHECK(groups[1].begin == layout.block(0).q_proj);
    CHECK(groups.back().begin == layout.final_norm());
    // Two slots of the largest group (the embedding, or the head with an untied lm_head of the
    // same size), plus the tied embedding's own.
    const std::int64_t largest = std::max(groups.back().size(), groups[1].size());
    CHECK(l3::model::gradient_slot_elements(layout) ==
          (tied ? 2 * groups[1].size() + groups.front().size() : 2 * largest));
  }
}

TEST_CASE("the memory plan of an 8B model at seq 8192 on 8 ranks", "[memory]") {
  l3::model::MemoryPlanInput in;
  in.model = l3::model::preset("llama3-8b");
  in.compute = DType::bf16;
  in.seq_len = 8192;
  in.micro_batch_rows = 1;
  in.placement.ranks = 8;
  const l3::model::ParameterLayout layout(in.model, HeadKind::language_model);
  const std::int64_t p = layout.total();
  CHECK(p > 8'000'000'000);  // 8.03B parameters
  CHECK(p < 8'100'000'000);

  in.recompute = false;
  const l3::model::MemoryPlan full = l3::model::plan_training_memory(in);
  in.recompute = true;
  const l3::model::MemoryPlan lean = l3::model::plan_training_memory(in);
  // bf16 weights + grads (2 + 2 bytes), fp32 master and moments of 1/8 (12 / 8 bytes).
  const std::int64_t states = 2 * p + 2 * p + 12 * ((p + 7) / 8);
  std::int64_t lean_states = 0;
  for (const auto& line : lean.lines) {
    if (line.what.starts_with("weights") || line.what.starts_with("master") ||
        line.what.starts_with("gradients") || line.what.starts_with("AdamW"))
      lean_states += line.bytes;
  }
  CHECK(lean_states == states);
  // Recomputation keeps one block's activations instead of 32: the difference is 31 blocks.
  const std::int64_t n = 8192;
  const std::int64_t block =
      2 * n * (3 * 4096 + 2 * 4096 + 2 * 1024 + 3 * 14336) + 4 * n * 2 + 4 * n * 32;
  CHECK(full.total() - lean.total() == 31 * block);

  // The CUDA backend's scratch: the fallback attention's backward over a whole 8192-token row
  // (scores, P, dP, dS of 8 KV-head groups: 12 bytes each) dominates; cuDNN's attention does not
  // use it, leaving the lm_head's fp32 logit block (256 MiB) as the largest.
  auto scratch_of = [](const l3::model::MemoryPlan& plan) {
    for (const auto& line : plan.lines)
      if (line.what.starts_with("CUDA scratch")) return line;
    return l3::model::MemoryLine{};
  };
  const std::int64_t squares = std::int64_t{8} * 8192 * 8192;
  CHECK(scratch_of(lean).what == "CUDA scratch (fallback attention)");
  // + fp32 row dots (32 heads) and fp32 dK, dV of the segment (8192 x 1024 each).
  CHECK(scratch_of(lean).bytes == 12 * squares + 4 * 32 * 8192 + 2 * 4 * 8192 * 1024);
  // cuDNN's deterministic backward (--attention auto, cudnn): a single 8192-token document is a
  // 1 x 8192 bucket whose dP workspace (2 bytes x 32 heads x 8192^2) reaches the 4 GiB limit, so
  // the plan counts the limit, and the fallback's scratch for the buckets above it.
  auto line_of = [](const l3::model::MemoryPlan& plan, std::string_view start) {
    for (const auto& line : plan.lines)
      if (line.what.starts_with(start)) return line;
    return l3::model::MemoryLine{};
  };
  in.attention = l3::model::AttentionPlan::cudnn_deterministic;
  const l3::model::MemoryPlan deterministic = l3::model::plan_training_memory(in);
  CHECK(scratch_of(deterministic).what == "CUDA scratch (fallback attention)");
  const l3::model::MemoryLine cudnn_own = line_of(deterministic, "cuDNN attention");
  CHECK(cudnn_own.what ==
        "cuDNN attention (deterministic backward): its scratch and cuDNN's dP workspace at its "
        "4 GiB limit (larger buckets: the fallback)");
  // Its scratch: tables of 8192 batches (i32 lengths, three i64 offsets of 8193), fp32
  // statistics and row sums of (8192 + 128) x 32, per-query-head dK and dV sized as fp32 for
  // GQA (x 128), no dQ accumulator (its empty piece still takes 256 bytes); each piece
  // 256-byte aligned.
  const std::int64_t rows = (8192 + 128) * 32;
  const std::int64_t tables = 8192 * 4 + 3 * ((8193 * 8 + 255) / 256 * 256);
  CHECK(cudnn_own.bytes ==
        tables + 2 * rows * 4 + 256 + 2 * rows * 128 * 4 + (std::int64_t{4} << 30));
  CHECK(deterministic.total() - lean.total() == cudnn_own.bytes);
  // The non-deterministic backward: the fallback's scratch is not needed; its own scratch adds
  // the fp32 dQ accumulator; cuDNN's own (small) workspace is not counted.
  in.attention = l3::model::AttentionPlan::cudnn_nondeterministic;
  const l3::model::MemoryPlan nondeterministic = l3::model::plan_training_memory(in);
  CHECK(line_of(nondeterministic, "cuDNN attention").bytes ==
        tables + 3 * rows * 128 * 4 + 2 * rows * 4);
  const l3::model::MemoryLine with_cudnn = scratch_of(nondeterministic);
  CHECK(with_cudnn.what == "CUDA scratch (lm_head + loss)");
  CHECK(with_cudnn.bytes > (std::int64_t{256} << 20));
  CHECK(with_cudnn.bytes < (std::int64_t{512} << 20));
  // 128 rows of 8192 tokens: the embedding gradient's partial sums (two fp32 rows of 4096 per
  // 64 tokens: 512 MiB), its sorted keys and positions (12 bytes a token) and CUB's sort
  // (8 bytes a token and 1 MiB) outgrow the lm_head's logit block.
  in.micro_batch_rows = 128;
  const l3::model::MemoryLine big_batch = scratch_of(l3::model::plan_training_memory(in));
  const std::int64_t tokens = 128 * 8192;
  CHECK(big_batch.what == "CUDA scratch (embedding gradient)");
  CHECK(big_batch.bytes == 2 * (tokens / 64) * 4096 * 4 + 12 * tokens + 8 * tokens + (1 << 20));
  in.micro_batch_rows = 1;
  // ZeRO-2: the bf16 gradients of two groups (the largest is the 8B model's head: the final
  // norm and the 128256 x 4096 lm_head) and 1/8 of all of them, instead of all of them; that
  // 1/8 in bf16 with one micro-batch per step, in fp32 when micro-batches add up there.
  const l3::model::MemoryPlan zero1 = l3::model::plan_training_memory(in);
  in.placement.stage = l3::model::ZeroStage::gradients;
  const l3::model::MemoryPlan zero2 = l3::model::plan_training_memory(in);
  std::int64_t gradient_bytes = 0;
  for (const auto& line : zero2.lines) {
    if (line.what.starts_with("gradients") || line.what.starts_with("reduced gradients"))
      gradient_bytes += line.bytes;
  }
  CHECK(gradient_bytes == 2 * 2 * (std::int64_t{128256} * 4096 + 4096) + 2 * ((p + 7) / 8));
  CHECK(zero1.total() - zero2.total() == 2 * p - gradient_bytes);
  in.placement.fp32_gradients = true;
  CHECK(l3::model::plan_training_memory(in).total() - zero2.total() == 2 * ((p + 7) / 8));
  // ZeRO-1's whole buffer in fp32: 2 more bytes per parameter.
  in.placement.stage = l3::model::ZeroStage::optimizer;
  CHECK(l3::model::plan_training_memory(in).total() - zero1.total() == 2 * p);
  in.placement.fp32_gradients = false;
  // The CPU backend has none of it.
  in.compute = DType::f32;
  CHECK(scratch_of(l3::model::plan_training_memory(in)).what.empty());
}

TEST_CASE("cuDNN's deterministic dP workspace is planned by bucket below its limit", "[memory]") {
  // The tiny model (4 heads, 2 kv heads, head_dim 16), 2 rows of 128: at most 256 segments
  // (bucket 256) of at most 128 tokens (bucket 128): 2 x 256 x 4 x 128^2 bytes, under 4 GiB,
  // so no call needs the fallback and the scratch does not hold its matrices.
  l3::model::MemoryPlanInput in;
  in.model = l3::model::preset("tiny");
  in.compute = DType::bf16;
  in.seq_len = 128;
  in.micro_batch_rows = 2;
  const l3::model::CudnnAttentionBytes own =
      l3::model::cudnn_attention_bytes(in.model, 256, 128, true);
  CHECK_FALSE(own.over_limit);
  CHECK(own.workspace == std::int64_t{2} * 256 * 4 * 128 * 128);
  in.attention = l3::model::AttentionPlan::cudnn_deterministic;
  const l3::model::MemoryPlan plan = l3::model::plan_training_memory(in);
  bool counted = false;
  for (const auto& line : plan.lines) {
    CHECK(line.what != "CUDA scratch (fallback attention)");
    if (line.what ==
        "cuDNN attention (deterministic backward): its scratch and cuDNN's dP "
        "workspace") {
      counted = true;
      CHECK(line.bytes == own.scratch + own.workspace);
    }
  }
  CHECK(counted);
  // A model cuDNN does not take (head_dim 8): the fallback's scratch, no cuDNN buffer.
  in.model.head_dim = 8;
  in.model.hidden_size = 32;
  for (const auto& line : l3::model::plan_training_memory(in).lines)
    CHECK_FALSE(line.what.starts_with("cuDNN attention"));
}

TEST_CASE("ZeRO-3 plans 1/G of the weights and two gathered layer groups", "[memory]") {
  // The target: Llama 3.1 70B at seq 8192 with recomputation, on 64 ranks of 80 GB.
  l3::model::MemoryPlanInput in;
  in.model = l3::model::preset("llama3.1-70b");
  in.compute = DType::bf16;
  in.seq_len = 8192;
  in.micro_batch_rows = 1;
  in.placement.ranks = 64;
  in.recompute = true;
  in.placement.stage = l3::model::ZeroStage::gradients;
  in.placement.fp32_gradients =
      true;  // several micro-batches per step: the larger reduced gradients
  const l3::model::ParameterLayout layout(in.model, HeadKind::language_model);
  const std::int64_t p = layout.total();
  CHECK(p > 70'000'000'000);  // 70.55B parameters
  CHECK(p < 71'000'000'000);
  const std::int64_t zero2 = l3::model::plan_training_memory(in).total();
  in.placement.stage = l3::model::ZeroStage::parameters;
  const l3::model::MemoryPlan plan = l3::model::plan_training_memory(in);
  std::string text;
  for (const auto& line : plan.lines) text += fmt::format("{}: {}\n", line.what, line.bytes);
  INFO(text);
  constexpr std::int64_t kGiB = std::int64_t{1} << 30U;
  CHECK(zero2 > 170 * kGiB);  // every rank holding all the bf16 weights does not fit
  CHECK(plan.total() < 72 * kGiB);
  // Every weight once per 64 ranks, as fp32 master pieces only (the bf16 weights exist only
  // gathered); the gather buffers are the shape of ZeRO-2's gradient slots (two of the largest
  // group: the head, the final norm and the 128256 x 8192 lm_head).
  const std::int64_t owned = (p + 63) / 64;
  REQUIRE(plan.lines.size() >= 2);
  CHECK(plan.lines[0].what == "gathered weights (bf16, ZeRO-3: two layer groups)");
  CHECK(plan.lines[0].bytes == 2 * std::int64_t{2} * (128256 * 8192 + 8192));
  CHECK(plan.lines[1].what == "master weights (fp32, ZeRO-3: 1/64, the only copy)");
  CHECK(plan.lines[1].bytes == 4 * owned);
  // ZeRO-2 holds every bf16 weight instead of the gather buffers; the rest is the same.
  CHECK(zero2 - plan.total() == 2 * p - plan.lines[0].bytes);

  // Hybrid sharding over groups of 8 ranks: the states are 1/8, whatever the number of ranks.
  in.placement.shard_group = 8;
  const l3::model::MemoryPlan hybrid = l3::model::plan_training_memory(in);
  CHECK(hybrid.lines[1].bytes == 4 * ((p + 7) / 8));
  in.placement.ranks = 512;
  CHECK(l3::model::plan_training_memory(in).total() == hybrid.total());
  // Groups larger than the run: one group of all the ranks.
  in.placement.ranks = 4;
  in.placement.shard_group = 0;
  const std::int64_t flat4 = l3::model::plan_training_memory(in).total();
  in.placement.shard_group = 8;
  CHECK(l3::model::plan_training_memory(in).total() == flat4);
  // ZeRO-1 holds every weight.
  in.placement.stage = l3::model::ZeroStage::optimizer;
  in.placement.shard_group = 0;
  in.placement.ranks = 64;
  const l3::model::MemoryPlan no_zero2 = l3::model::plan_training_memory(in);
  CHECK(no_zero2.lines[0].bytes == 2 * p);
}

TEST_CASE(
    "with LoRA the plan is what the model allocates: the frozen weights once, the adapters' "
    "gradients and activations",
    "[memory][lora]") {
  for (const bool recompute : {false, true}) {
    for (const double dropout : {0.0, 0.1}) {
      INFO("recompute " << recompute << ", dropout " << dropout);
      l3::kernels::CpuOps ops;
      const l3::model::ModelConfig config = l3::model::preset("tiny");
      l3::model::LoraConfig lora;
      lora.rank = 4;
      lora.dropout = dropout;
      lora.targets = l3::model::parse_lora_targets("q,v,down");
      l3::model::LlamaModel model(config, HeadKind::language_model, ops,
                                  {.recompute = recompute, .lora = lora});
      const std::int64_t rows = 3;
      const std::int64_t seq_len = 32;
      (void)l3::train::LanguageModelLoss(model).forward_backward(reversal_batch(rows, seq_len),
                                                                 1.0F);
      CHECK(ops.allocated_bytes() == l3::model::model_bytes(config, HeadKind::language_model,
                                                            DType::f32, recompute, rows * seq_len,
                                                            seq_len, true, lora));
    }
  }
  // 8B on 8 GPUs at seq 8192: the frozen bf16 weights, and AdamW state for 42M adapter values.
  l3::model::MemoryPlanInput in;
  in.model = l3::model::preset("llama3.1-8b");
  in.seq_len = 8192;
  in.placement.ranks = 8;
  in.placement.frozen_model = true;
  in.recompute = true;
  in.lora.rank = 16;
  const l3::model::MemoryPlan plan = l3::model::plan_training_memory(in);
  std::string text;
  for (const auto& line : plan.lines) text += line.what + "\n";
  CHECK_THAT(text, Catch::Contains("weights (bf16, 8.030B parameters, frozen)") &&
                       Catch::Contains("LoRA adapters (bf16, rank 16: 41.94M parameters)") &&
                       Catch::Contains("gradients (bf16, of the adapters)"));
  in.lora = {};
  in.placement.frozen_model = false;
  CHECK(plan.total() < l3::model::plan_training_memory(in).total() / 2);
}
