// l3::plan_memory: the configuration's memory budget per rank (model/memory_plan), for the
// `--dry-run-memory` mode of the CLI and for hosts sizing a job before they start it.
#include <fmt/format.h>

#include "api/public_errors.hpp"
#include "api/run_config_parsed.hpp"
#include "core/error.hpp"
#include "kernels/backends.hpp"
#include "l3/l3.hpp"
#include "model/memory_plan.hpp"
#include "train/memory_check.hpp"
#include "train/model_source.hpp"

namespace l3 {

MemoryPlan plan_memory(const RunConfig& config, int ranks) {
  MemoryPlan out;
  api::rethrow_as_public([&] {
    if (ranks < 1) throw core::usage_error(fmt::format("cannot plan for {} ranks", ranks));
    const train::TrainConfig& t = config.parsed_->train;
    const train::ModelSource source = train::resolve_model_source(t.model, t.init);
    // What would run here: --backend auto computes on CUDA only where a device is visible (a
    // login node without a GPU plans for its CPU; --backend cuda plans for GPU nodes).
    const bool cuda =
        t.backend == kernels::Backend::cuda ||
        (t.backend == kernels::Backend::automatic && kernels::visible_cuda_devices() > 0);
    const model::MemoryPlanInput in = train::memory_plan_input(t, source.config, cuda, ranks);
    const model::MemoryPlan plan = model::plan_training_memory(in);
    out.backend = cuda ? "cuda (bf16)" : "cpu (fp32)";
    out.ranks = ranks;
    out.summary = fmt::format(
        "{} on {} rank{}{}, {}, micro-batch {} x {} tokens, recompute {}, ZeRO-{}",
        train::phase_name(t.phase), ranks, ranks == 1 ? "" : "s",
        in.placement.grid().empty() ? std::string() : fmt::format(" ({})", in.placement.grid()),
        out.backend,
        t.phase == Phase::sft ? fmt::format("{}", t.micro_batch)
        : t.phase == Phase::grpo
            ? fmt::format("{} completions", t.micro_batch)
            : fmt::format("{} pairs = at most {} rows", t.micro_batch, 2 * t.micro_batch),
        t.seq_len, t.recompute ? "on" : "off", in.placement.stage_name());
    for (const model::MemoryLine& line : plan.lines) out.lines.push_back({line.what, line.bytes});
    out.total_bytes = plan.total();
  });
  return out;
}

}  // namespace l3
