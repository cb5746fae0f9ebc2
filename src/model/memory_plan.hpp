// What training a model takes in the compute backend's memory (GPU memory on the CUDA backend),
// per rank, computed from the configuration alone (nothing is allocated): the weights, their fp32
// master copy and gradients, this rank's AdamW moments, and the activations of one micro-batch as
// LlamaModel lays them out. tests/unit/memory_plan_test.cpp checks the model's part against what
// the model really allocates. `llama3-hpc sft|reward --dry-run-memory` prints it (docs/GPU.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"
#include "model/model_config.hpp"
#include "model/parameter_layout.hpp"
#include "model/placement.hpp"

namespace l3::model {

enum class AttentionPlan : std::uint8_t { fallback, cudnn_deterministic, cudnn_nondeterministic };

struct MemoryPlanInput {
  ModelConfig model;
  HeadKind head = HeadKind::language_model;
  kernels::DType compute = kernels::DType::bf16;  // weights and activations
  bool recompute = false;
  std::int64_t micro_batch_rows = 1;
  std::int64_t seq_len = 2048;
  // Where the trained states live (model/placement.hpp): ZeRO-1 holds 1/G of the AdamW moments,
  // ZeRO-2 the gradients of two layer groups and 1/G of them reduced, ZeRO-3 1/G of the weights
  // too, gathered two layer groups at a time (and the tied embedding); G: all the ranks or a
  // hybrid shard group. With LoRA's frozen model sharded, the frozen weights are 1/ranks.
  // placement.fp32_gradients: gradients add up in fp32 (in bf16 only): the whole buffer, or
  // ZeRO-2's 1/G.
  Placement placement{};
  // CUDA: the attention the backend resolved --attention to (kernels::attention_choice): cuDNN
  // keeps a buffer of its own (cudnn_attention_sizes.hpp); the fallback's lives in the scratch.
  AttentionPlan attention = AttentionPlan::fallback;
  // LoRA (rank > 0): the weights frozen (no gradients, no master copy); gradients, master
  // weights and moments are the adapters' (and a reward model's score head), and each adapter
  // keeps (tokens, r) activations.
  LoraConfig lora{};
  // Online RL: the generation engine on the trained model (slots sequences of capacity
  // positions: its KV cache and its passes' buffers); 0: none.
  std::int64_t generation_slots = 0;
  std::int64_t generation_capacity = 0;
  // Frozen models beside the trained one that run forward passes of one micro-batch (GRPO's
  // reference copy, its reward model): their weights, whole or 1/ranks with the gather slots
  // (sharded), and their workspace with one block's activations (nothing goes backward).
  struct FrozenModel {
    std::string what;  // "GRPO reference", "reward model"
    ModelConfig model;
    HeadKind head = HeadKind::language_model;
    bool sharded = false;
  };
  std::vector<FrozenModel> frozen_models;
};

struct MemoryLine {
  std::string what;
  std::int64_t bytes = 0;
};

struct MemoryPlan {
  std::vector<MemoryLine> lines;
  [[nodiscard]] std::int64_t total() const noexcept;
};

[[nodiscard]] MemoryPlan plan_training_memory(const MemoryPlanInput& input);

// cuDNN attention's own buffer for micro-batches of `tokens` tokens in rows of `seq_len`: its
// backward's scratch and, for the deterministic backward, cuDNN's dP workspace of the largest
// bucket such a micro-batch can make, at most the plan limit (above it a call runs on the
// fallback: `over_limit`). The non-deterministic backward's own cuDNN workspace is small and
// not counted (l3-bench-gpu --attention-variants measures both).
struct CudnnAttentionBytes {
  std::int64_t scratch = 0;
  std::int64_t workspace = 0;
  bool over_limit = false;
};
[[nodiscard]] CudnnAttentionBytes cudnn_attention_bytes(const ModelConfig& model,
                                                        std::int64_t tokens, std::int64_t seq_len,
                                                        bool deterministic);

// The parts of the plan that LlamaModel itself allocates when training (weights, gradients
// unless ZeRO-2 holds them, and the workspace of one micro-batch of `tokens` with RoPE tables
// for `seq_len` positions; the master weights are the optimizer's: ModelOptions::keep_master
// false). context_ranks C > 1: `tokens` is a share of a whole batch of C x tokens, whose
// keys and values the model gathers a layer at a time.
[[nodiscard]] std::int64_t model_bytes(const ModelConfig& model, HeadKind head,
                                       kernels::DType compute, bool recompute, std::int64_t tokens,
                                       std::int64_t seq_len, bool own_gradients = true,
                                       const LoraConfig& lora = {}, int context_ranks = 1);

// LoRA's activations in the model's workspace: each adapter's (tokens, r), the backward's one,
// and with dropout the dropped input (tokens, widest input). Bytes; 0 without LoRA.
[[nodiscard]] std::int64_t lora_activation_bytes(const ModelConfig& model, kernels::DType compute,
                                                 bool recompute, std::int64_t tokens,
                                                 const LoraConfig& lora);

// ZeRO-2's gradient slots (parallel::DataParallel): two the size of the largest gradient group,
// and one for the embedding's group when the lm_head is tied to it. Elements. ZeRO-3's gather
// buffers have the same shape.
[[nodiscard]] std::int64_t gradient_slot_elements(const ParameterLayout& layout);

}  // namespace l3::model
