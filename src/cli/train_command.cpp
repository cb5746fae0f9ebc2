#include "cli/train_command.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include "api/train_options.hpp"
#include "cli/stop_signals.hpp"
#include "core/error.hpp"
#include "core/words.hpp"
#include "kernels/backends.hpp"
#include "kernels/cpu/blas_core.hpp"
#include "l3/l3.hpp"
#include "train/metrics.hpp"

namespace l3::cli {

namespace {

// --dry-run-memory: the plan, printed by rank 0; nothing is allocated or trained.
int print_memory_plan(const CommandContext& context, const l3::RunConfig& config) {
  const int planned = std::stoi(config.get("dry-run-ranks"));
  const l3::MemoryPlan plan = l3::plan_memory(config, planned > 0 ? planned : context.world.size());
  if (!context.world.is_root()) return core::kExitOk;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::string text = fmt::format("memory per rank: {}\n", plan.summary);
  for (const l3::MemoryPlan::Line& line : plan.lines) {
    text +=
        fmt::format("  {:<62} {:>9.2f} GiB\n", line.what, static_cast<double>(line.bytes) / kGiB);
  }
  text += plan.backend.starts_with("cuda")
              ? "  not included: the CUDA context (about 0.5 GiB), NCCL's buffers, the memory "
                "allocator's fragmentation\n"
              : "  not included: the program, the MPI library's buffers, the memory allocator's "
                "fragmentation\n";
  // Last, so that scripts read the figure with `tail -1`.
  text +=
      fmt::format("  {:<62} {:>9.2f} GiB\n", "total", static_cast<double>(plan.total_bytes) / kGiB);
  std::cout << text << std::flush;
  return core::kExitOk;
}

}  // namespace

std::string thread_choice(const dist::ThreadBudget& threads) {
  return fmt::format(
      "{} compute thread{} per rank ({}; OMP_NUM_THREADS=N to choose); {}", threads.threads,
      threads.threads == 1 ? "" : "s", threads.reason,
      threads.wait == dist::WaitPolicy::passive
          ? fmt::format("ranks share cores ({}): MPI waits passively, sleeping between polls "
                        "(L3_WAIT_POLICY=active to spin)",
                        threads.wait_reason)
          : fmt::format("MPI waits actively ({})", threads.wait_reason));
}

void log_blas_core(const CommandContext& context, std::string_view backend) {
  // The threads first: what a slow run on a shared node is checked against.
  if (context.threads != nullptr) {
    context.log.info("{}", thread_choice(*context.threads));
    const std::string busy =
        dist::busy_node_advice(dist::other_running_threads(context.world.local_size()),
                               static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)),
                               context.world.local_size(), context.threads->threads);
    if (!busy.empty()) context.log.warn("{}", busy);
  }
  if (backend != "cpu" && (backend != "auto" || kernels::visible_cuda_devices() > 0)) return;
  const kernels::cpu::BlasCore core = kernels::cpu::openblas_core();
  context.log.info("cpu backend: OpenBLAS core {} ({})", core.name, core.config);
  if (!core.warning.empty()) context.log.warn("{}", core.warning);
}

namespace {

// `llama3-hpc sft|reward` through the public API (include/l3/l3.hpp), as an embedding host would:
// the CLI has no shortcut into the trainer.
int run_phase(const CommandContext& context, l3::Phase phase) {
  std::vector<std::string> args{std::string(train::phase_name(phase))};
  args.insert(args.end(), context.args.begin(), context.args.end());
  const l3::RunConfig config = l3::RunConfig::from_args(args);
  if (config.get("dry-run-memory") == "true") return print_memory_plan(context, config);
  const bool has_checkpoints = !config.get("ckpt-dir").empty();
  const auto stopped_before_start = [&] {
    if (context.world.is_root()) {
      std::cout << fmt::format(
                       "{} stopped by {} before its first step, with nothing to save; run the "
                       "same command again to continue (exit 75)\n",
                       train::phase_name(phase),
                       stop_signal_name().empty() ? "a signal to another rank" : stop_signal_name())
                << std::flush;
    }
    return core::kExitCheckpointed;
  };
  // The signal handlers were installed before MPI started (app.cpp): a signal that came while
  // the run is being built stops it there.
  std::optional<l3::Session> session;
  try {
    session.emplace(context.world.comm(), config, nullptr, &stop_flag());
  } catch (const l3::Error& e) {
    if (e.exit_code() == core::kExitCheckpointed) return stopped_before_start();
    throw;
  }
  log_blas_core(context, config.get("backend"));
  bool announced = false;
  session->on_step([&](const l3::StepMetrics& /*metrics*/) {
    if (!announced && stop_flag().load()) {
      announced = true;
      context.log.local(core::LogLevel::warn, "received {}: checkpointing and stopping",
                        stop_signal_name());
    }
  });
  const l3::RunSummary s = session->run();
  if (s.stopped && s.steps == 0) return stopped_before_start();
  if (s.stopped && !has_checkpoints) {
    throw core::internal_error(fmt::format(
        "{} stopped by a signal at step {} with nothing saved (no --ckpt-dir): running it again "
        "starts over; give --ckpt-dir to make runs restartable",
        train::phase_name(phase), s.first_step + s.steps));
  }
  if (s.stopped) {
    if (context.world.is_root()) {
      std::cout << fmt::format(
                       "{} stopped at step {} with checkpoint {}; run the same command "
                       "again to continue (exit 75)\n",
                       train::phase_name(phase), s.first_step + s.steps, s.checkpoint)
                << std::flush;
    }
    return core::kExitCheckpointed;
  }
  if (context.world.is_root()) {
    std::string line =
        fmt::format("{} done: {} in {}", train::phase_name(phase), core::count_of(s.steps, "step"),
                    train::format_duration(s.seconds));
    if (s.last_step) line += fmt::format(", final loss {:.4f}", s.last_step->loss);
    line += fmt::format(", {:.0f} tokens/s", s.tokens_per_s);
    if (s.skipped_steps > 0)
      line += fmt::format(", {}", core::count_of(s.skipped_steps, "skipped step"));
    if (s.last_eval) line += fmt::format("\n  {}", train::format_eval_line(*s.last_eval));
    if (!s.checkpoint.empty()) line += fmt::format("\n  checkpoint: {}", s.checkpoint);
    std::cout << line << '\n' << std::flush;
  }
  return core::kExitOk;
}

}  // namespace

void declare_sft_options(po::options_description& options,
                         po::positional_options_description& /*positional*/) {
  api::declare_train_options(options, train::Phase::sft);
}

void declare_reward_options(po::options_description& options,
                            po::positional_options_description& /*positional*/) {
  api::declare_train_options(options, train::Phase::reward);
}

int run_sft(const CommandContext& context) { return run_phase(context, l3::Phase::sft); }
int run_reward(const CommandContext& context) { return run_phase(context, l3::Phase::reward); }

void declare_dpo_options(po::options_description& options,
                         po::positional_options_description& /*positional*/) {
  api::declare_train_options(options, train::Phase::dpo);
}

int run_dpo(const CommandContext& context) { return run_phase(context, l3::Phase::dpo); }

void declare_grpo_options(po::options_description& options,
                          po::positional_options_description& /*positional*/) {
  api::declare_train_options(options, train::Phase::grpo);
}

int run_grpo(const CommandContext& context) { return run_phase(context, l3::Phase::grpo); }

}  // namespace l3::cli
