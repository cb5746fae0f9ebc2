// l3::plan_memory: the configuration's memory budget per rank (model/memory_plan), for the
// `--dry-run-memory` mode of the CLI and for hosts sizing a job before they start it.
#include <fmt/format.h>

#include "api/public_errors.hpp"
#include "api/run_config_parsed.hpp"
#include "core/error.hpp"
#include "kernels/backends.hpp"
#include "l3/l3.hpp"
#include "model/memory_plan.hpp"
#include "train/model_source.hpp"

namespace l3 {

MemoryPlan plan_memory(const RunConfig& config, int ranks) {
  MemoryPlan out;
  api::rethrow_as_public([&] {
    if (ranks < 1) throw core::usage_error(fmt::format("cannot plan for {} ranks", ranks));
    const train::TrainConfig& t = config.parsed_->train;
    const train::ModelSource source = train::resolve_model_source(t.model, t.init);
    bool cuda = t.backend == "cuda";
    if (t.backend == "auto") {
      for (const kernels::BackendReport& b : kernels::describe_backends())
        if (b.name == "cuda") cuda = b.compiled;
    }
    model::MemoryPlanInput in;
    in.model = source.config;
    in.head = t.phase == Phase::sft ? model::HeadKind::language_model : model::HeadKind::reward;
    in.compute = cuda ? kernels::DType::bf16 : kernels::DType::f32;
    in.recompute = t.recompute;
    in.seq_len = t.seq_len;
    // Reward: a pair's two sequences share a row when they fit in one; planned for the worst
    // case, each a row of its own.
    in.micro_batch_rows = t.phase == Phase::sft ? t.micro_batch : 2 * t.micro_batch;
    in.ranks = ranks;
    in.shard_optimizer = t.shard_optimizer;
    in.shard_gradients = t.shard_gradients;
    in.fp32_gradients = in.compute != kernels::DType::f32 && t.fp32_gradients(ranks);
    in.cudnn_attention = t.attention == "cudnn";
    const model::MemoryPlan plan = model::plan_training_memory(in);
    out.backend = cuda ? "cuda (bf16)" : "cpu (fp32)";
    out.ranks = ranks;
    for (const model::MemoryLine& line : plan.lines) out.lines.push_back({line.what, line.bytes});
    out.total_bytes = plan.total();
  });
  return out;
}

}  // namespace l3
