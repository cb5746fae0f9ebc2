#include "train/memory_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <exception>

#include "core/error.hpp"
#include "core/host_memory.hpp"
#include "dist/collectives.hpp"
#include "kernels/backends.hpp"
#include "parallel/placement_choice.hpp"
#include "train/grpo/rollout_source.hpp"
#include "train/model_source.hpp"

namespace l3::train {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Per token of a prefetched step: the batch's tokens, targets and positions (int32), mask (u8)
// and segment bounds (at most one int32 per token), and the token and mask read from a shard.
constexpr std::int64_t kHostBytesPerToken = 4 + 4 + 4 + 1 + 4 + 4 + 1;

// GiB, or MiB below one (a small model's or a small budget's figures are not all 0.0 GiB).
std::string gib(std::int64_t bytes) {
  const auto b = static_cast<double>(bytes);
  return b < kGiB ? fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0))
                  : fmt::format("{:.1f} GiB", b / kGiB);
}

// L3_MEMORY_PER_RANK_MIB in bytes; 0 when unset.
std::int64_t memory_per_rank_override() {
  const char* text = std::getenv("L3_MEMORY_PER_RANK_MIB");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long long mib = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || mib <= 0 || mib > (std::int64_t{1} << 40)) {
    throw core::usage_error(
        fmt::format("L3_MEMORY_PER_RANK_MIB={}: a number of MiB above 0 expected", text));
  }
  return static_cast<std::int64_t>(mib) << 20U;
}

}  // namespace

model::MemoryPlanInput memory_plan_input(const TrainConfig& config, const model::ModelConfig& model,
                                         bool cuda, int ranks) {
  model::MemoryPlanInput in;
  in.model = model;
  in.head =
      config.phase == Phase::reward ? model::HeadKind::reward : model::HeadKind::language_model;
  in.compute = cuda ? kernels::DType::bf16 : kernels::DType::f32;
  in.recompute = config.recompute;
  in.seq_len = config.seq_len;
  // Reward: a pair's two sequences share a row when they fit in one; planned for the worst
  // case, each a row of its own.
  // GRPO: a completion (with its prompt) is a row.
  in.micro_batch_rows = config.phase == Phase::sft || config.phase == Phase::grpo
                            ? config.micro_batch
                            : 2 * config.micro_batch;
  // DPO: LoRA's reference is the same model without its adapters, full fine-tuning's is
  // precomputed: no second model either way (GRPO's: below).
  in.placement = parallel::choose_placement(config, ranks, in.compute);
  // The attention the backend resolves --attention to on this node's GPU (without one: an
  // sm_90 GPU; kernels::attention_choice), with the buffer it needs.
  if (cuda) {
    const kernels::AttentionChoice attention =
        kernels::attention_choice(config.attention, config.deterministic, 0, config.device);
    in.attention = !attention.cudnn ? model::AttentionPlan::fallback
                   : attention.deterministic_backward
                       ? model::AttentionPlan::cudnn_deterministic
                       : model::AttentionPlan::cudnn_nondeterministic;
  }
  in.lora = config.lora;
  if (config.phase == Phase::grpo) {
    in.generation_slots =
        grpo::engine_slots(config.global_batch, config.grpo.num_generations, ranks);
    in.generation_capacity = config.seq_len;
    // With --beta > 0 a reference: LoRA's is its base (nothing more), full fine-tuning's a
    // frozen copy of the model; a reward model, frozen too. Both sharded with
    // --shard-parameters.
    if (config.grpo.beta > 0 && !config.lora.enabled()) {
      in.frozen_models.push_back({.what = "GRPO reference",
                                  .model = model,
                                  .head = model::HeadKind::language_model,
                                  .sharded = config.shard_parameters});
    }
    if (!config.grpo.reward_model.empty()) {
      in.frozen_models.push_back(
          {.what = "reward model",
           .model = resolve_model_source("", config.grpo.reward_model).config,
           .head = model::HeadKind::reward,
           .sharded = config.shard_parameters});
    }
  }
  return in;
}

std::int64_t prefetch_host_bytes(std::int64_t rows, std::int64_t seq_len, int depth) {
  return (static_cast<std::int64_t>(depth) + 1) * rows * seq_len * kHostBytesPerToken;
}

void require_memory(const dist::World& world, const kernels::Ops& ops, const MemoryNeed& need) {
  std::exception_ptr failure;
  try {
    std::int64_t backend = 0;
    const model::MemoryLine* largest = nullptr;
    for (const model::MemoryLine& line : need.backend) {
      backend += line.bytes;
      if (largest == nullptr || line.bytes > largest->bytes) largest = &line;
    }
    const int sharing = std::max(1, world.local_size());
    std::int64_t host_share = core::host_memory_bytes() / sharing;
    std::int64_t device = ops.memory_capacity();
    const std::int64_t given = memory_per_rank_override();
    if (given > 0) (device > 0 ? device : host_share) = given;
    const auto refuse = [&](std::int64_t needed, std::int64_t has, std::string_view where,
                            const std::string& part) {
      throw core::bad_input(fmt::format(
          "this run needs {} of {} memory per rank, more than the {} it has here{}; the largest "
          "part: {}. Lower {}",
          gib(needed), where, gib(has),
          given > 0 ? std::string(" (L3_MEMORY_PER_RANK_MIB)")
          : device > 0 && where == "GPU"
              ? std::string()
              : fmt::format(" ({} rank{} on this node)", sharing, sharing == 1 ? "" : "s"),
          part, need.remedy));
    };
    const std::string largest_part = largest != nullptr
                                         ? fmt::format("{} {}", largest->what, gib(largest->bytes))
                                         : std::string("none");
    if (device > 0) {
      if (backend > device) refuse(backend, device, "GPU", largest_part);
      if (host_share > 0 && need.host > host_share) {
        refuse(need.host, host_share, "host", fmt::format("prefetched data {}", gib(need.host)));
      }
    } else if (host_share > 0 && backend + need.host > host_share) {
      const std::string part = need.host > (largest != nullptr ? largest->bytes : 0)
                                   ? fmt::format("prefetched data {}", gib(need.host))
                                   : largest_part;
      refuse(backend + need.host, host_share, "host", part);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
}

}  // namespace l3::train
