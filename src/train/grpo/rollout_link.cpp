// RolloutSource's part in asynchronous GRPO (generation_link.hpp): on the training ranks, the
// setup, the weights, the batches received and kept for checkpoints, the generating ranks let go;
// on the generating ranks, a batch made with the behaviour policy's log-probabilities.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "core/bounded_read.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/rng.hpp"
#include "core/timer.hpp"
#include "core/trace_range.hpp"
#include "dist/collectives.hpp"
#include "io/data/epoch_plan.hpp"
#include "train/grpo/advantages.hpp"
#include "train/grpo/answer_match.hpp"
#include "train/grpo/completion.hpp"
#include "train/grpo/rollout_cache.hpp"
#include "train/grpo/rollout_source.hpp"

namespace l3::train::grpo {

using nlohmann::json;
std::string RolloutSource::setup_text(const model::ModelConfig& config,
                                      const std::string& tokenizer, WireType weights) {
  return json{{"model", config.to_hf_json()},
              {"tokenizer", tokenizer},
              {"weights_dtype", to_string(weights)}}
      .dump();
}

void RolloutSource::send_setup() {
  // The generating ranks wait for this in GenerationWorker's constructor, in this order.
  const GenerationLink& link = *config_.link;
  const MPI_Comm comm = link.comm.get();
  if (world_.is_root()) {
    const std::string text = setup_text(model_.config(), config_.tokenizer, config_.weights_wire);
    for (int g = 0; g < link.generators; ++g)
      send_text(comm, text, link.first_generator() + g, kSetupTag);
  }
  if (model_.has_adapters()) {
    // The frozen base once, from every training rank its pieces (whole from rank 0 unless it
    // is sharded), in fp32: the generating ranks' model rounds it as this rank's did.
    const WeightPieces base = config_.frozen_base();
    for (int g = 0; g < link.generators; ++g) send_pieces(comm, base, link.first_generator() + g);
  }
  prompts_.share(comm, 0);
  set_up_ = true;
}

void RolloutSource::send_weights(std::int64_t version) {
  if (version <= sent_version_) return;
  const GenerationLink& link = *config_.link;
  const MPI_Comm comm = link.comm.get();
  const core::Stopwatch watch;
  // The cycles whose batch this version generates (by their first step): every one not asked
  // for yet whose behaviour version it is (the first: cycles 0 .. S; then c + S), up to the
  // run's end.
  std::vector<std::int64_t> batches;
  while (next_request_ < total_ && config_.settings.behaviour_version(next_request_) <= version) {
    batches.push_back(next_request_);
    next_request_ += config_.settings.num_iterations;
  }
  std::vector<int> generators(static_cast<std::size_t>(link.generators));
  for (int g = 0; g < link.generators; ++g)
    generators[static_cast<std::size_t>(g)] = link.first_generator() + g;
  // Nonblocking: the version travels while this rank trains (complete_sends).
  auto sends = std::make_unique<VersionSends>(version);
  if (world_.is_root())
    sends->send_text(comm, json{{"version", version}, {"batches", batches}}.dump(), generators,
                     kControlTag);
  weights_bytes_ +=
      sends->send_pieces(comm, config_.trained_weights(), generators, config_.weights_wire);
  outgoing_.push_back(std::move(sends));
  sent_version_ = version;
  weights_ms_ += watch.milliseconds();
}

void RolloutSource::complete_sends(std::optional<std::int64_t> version) {
  const core::Stopwatch watch;
  while (!outgoing_.empty() && (!version || outgoing_.front()->version() <= *version)) {
    outgoing_.front()->complete();
    outgoing_.pop_front();
  }
  weights_ms_ += watch.milliseconds();
}

const std::string& RolloutSource::receive_batch(std::int64_t step) {
  const GenerationLink& link = *config_.link;
  const core::Stopwatch watch;
  // The batches come in the order they were asked for.
  while (last_received_ < step) {
    std::string text = receive_text(link.comm.get(), link.first_generator(), kBatchTag);
    json head = json::parse(text, nullptr, false);
    if (head.is_discarded() || !head.is_object())
      throw core::internal_error("asynchronous GRPO: a batch message that is not JSON");
    if (head.contains("error")) {
      // A generating rank failed (a verifier, a reward model): its error is the run's.
      generators_failed_ = true;
      const std::string message = head["error"].get<std::string>();
      const int code = head.value("exit_code", 1);
      if (code == core::kExitBadInput) throw core::bad_input(message);
      // Stopped by the job's signal while it scored: the run continues from its last checkpoint.
      if (code == core::kExitCheckpointed) throw core::Error(core::ErrorKind::stopped, message);
      throw core::internal_error(message);
    }
    const auto got = head.at("step").get<std::int64_t>();
    const std::int64_t due = last_received_ + config_.settings.num_iterations;
    if (got != due)
      throw core::internal_error(fmt::format(
          "asynchronous GRPO: the batch of step {} came when step {}'s was due", got + 1, due + 1));
    if (!config_.cache_dir.empty()) {
      // Before any checkpoint that needs it (before_checkpoint), where a resumed run finds it.
      check_rollout_cache(config_.cache_dir);
      std::filesystem::create_directories(config_.cache_dir);
      core::write_file_atomically(cycle_file(got), text);
    }
    received_[got] = std::move(text);
    last_received_ = got;
  }
  wait_ms_ += watch.milliseconds();
  return received_.at(step);
}

void RolloutSource::linked_next(std::int64_t step) {
  const GrpoSettings& s = config_.settings;
  if (!set_up_) {
    send_setup();
    // A resumed run's batches of the next S cycles (and of the one it resumes inside) were
    // generated before its checkpoint, with policies it no longer has: they come from the cache;
    // the first one asked for is generated with the checkpoint's weights or later ones.
    next_request_ = first_request_ = s.first_generated_after(step);
    last_received_ = first_request_ - s.num_iterations;
  }
  const std::int64_t cycle = s.cycle_start(step);
  if (step != cycle) {
    // Inside a cycle of --num-iterations: its batch is in use, or (a run resumed here) in the
    // cache as its first step completed it (use_batch).
    if (cycle_ != cycle) restore_cycle(cycle);
    return;
  }
  wait_ms_ = weights_ms_ = 0.0;
  weights_bytes_ = 0;
  // The weights after `step` steps go first (nonblocking): on-policy (S = 0) they generate this
  // step's batch; otherwise a later one's, and the generating ranks receive them while they
  // still generate this step's batch with the version before.
  send_weights(step);
  std::string text;
  std::exception_ptr failure;
  if (world_.is_root()) {
    try {
      if (step >= first_request_) {
        text = receive_batch(step);
      } else {
        // Generated before the checkpoint this run resumed from.
        const std::string path = cycle_file(step);
        if (config_.cache_dir.empty() || !std::filesystem::exists(path)) {
          throw core::bad_input(
              fmt::format("resuming asynchronous GRPO (--max-staleness {}) needs the generation "
                          "batch of step {}, made before the checkpoint; it is missing",
                          s.staleness(), step + 1),
              {.file = path});
        }
        text = core::read_text_file(path, "a GRPO generation batch", std::size_t{1} << 30);
      }
      received_.erase(received_.begin(), received_.upper_bound(step));
      prune_cache(step);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world_, failure);
  text = dist::broadcast_string(world_.comm(), text);
  // The version that generated this batch was received before it was generated: its sends, and
  // the older ones', are complete or about to be. (Waiting for a newer one could wait for a
  // generating rank that first sends batches this rank takes later.)
  complete_sends(s.behaviour_version(step));
  std::vector<std::pair<std::string, double>> metrics;
  std::vector<Completion> completions = parse_batch(text, step, cycle_file(step), metrics);
  if (s.staleness() > 0 && !s.importance_sampling_correction) {
    // Without the correction the generating ranks compute no behaviour log-probabilities: the
    // ratio is taken against the generator's own (TRL's AsyncGRPOTrainer).
    for (Completion& c : completions) c.old_logprobs = c.logprobs;
  }
  std::array<double, 2> waits{wait_ms_, weights_ms_};
  dist::all_reduce(world_.comm(), std::span<double>(waits), dist::ReduceOp::max, "linked waits");
  metrics.emplace_back("time/generation_wait_ms", waits[0]);
  metrics.emplace_back("time/weights_ms", waits[1]);
  metrics.emplace_back("weights/bytes",
                       static_cast<double>(dist::all_reduce(world_.comm(), weights_bytes_,
                                                            dist::ReduceOp::sum, "weight bytes")));
  metrics.emplace_back("staleness", static_cast<double>(step - s.behaviour_version(step)));
  use_batch(std::move(completions), std::move(metrics), step);
}

void RolloutSource::before_checkpoint(std::int64_t steps) {
  if (config_.link == nullptr || config_.generate) return;
  // The batches of the next S cycles exist only on the generating ranks' side of the lag: a run
  // resumed from this checkpoint reads them from the cache. Rank 0 takes them now
  // (those asked for; the others are generated from the checkpoint's weights).
  std::exception_ptr failure;
  if (world_.is_root()) {
    try {
      const GrpoSettings& s = config_.settings;
      const std::int64_t last = std::min(s.first_generated_after(steps), next_request_);
      if (last_received_ < last - s.num_iterations) (void)receive_batch(last - s.num_iterations);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world_, failure);
}

void RolloutSource::end_run(bool stopped) {
  if (config_.link == nullptr || config_.generate || ended_ || generators_failed_) return;
  ended_ = true;
  const GenerationLink& link = *config_.link;
  // Stopped before the first step: the generating ranks still wait for their setup.
  if (!set_up_) send_setup();
  // Every batch asked for is taken (its sender waits for that), every version's sends
  // completed, then the stop. On an error's way out nothing waits for the sends: a generating
  // rank that failed takes them no more (the Requests let them go).
  const std::int64_t last = next_request_ - config_.settings.num_iterations;
  if (world_.is_root() && last_received_ < last) (void)receive_batch(last);
  if (!leaving_on_error_) complete_sends(std::nullopt);
  if (!world_.is_root()) return;
  const std::string control = json{{"stop", true}, {"stopped", stopped}}.dump();
  for (int g = 0; g < link.generators; ++g)
    send_text(link.comm.get(), control, link.first_generator() + g, kControlTag);
}

std::string RolloutSource::make_batch(std::int64_t step,
                                      const std::vector<std::pair<std::string, double>>& extra) {
  const std::int64_t per_epoch = *steps_in_epoch(0);
  position_ = {step / per_epoch, step % per_epoch};
  Rolled rolled = generate_batch(step);
  for (const auto& m : extra) rolled.metrics.push_back(m);
  return batch_text(rolled.completions, rolled.metrics, step);
}

void RolloutSource::behaviour_log_probabilities(std::vector<Completion>& completions) {
  // The trainer's forward pass of the policy that generated them (the generating rank's
  // weights), over each prompt's completions in packs of --micro-batch: the same packs whatever
  // the number of generating ranks (a prompt's group is on one rank), so the same bits.
  const core::TraceRange range("rollout: behaviour log-probabilities");
  const auto g = static_cast<std::size_t>(config_.settings.num_generations);
  const auto per = static_cast<std::size_t>(std::max<std::int64_t>(config_.micro_batch, 1));
  for (std::size_t group = 0; group < completions.size(); group += g) {
    for (std::size_t first = group; first < group + g; first += per) {
      const std::size_t last = std::min(first + per, group + g);
      data::BatchBuilder builder(1, static_cast<std::int64_t>(last - first) * config_.seq_len,
                                 pad_);
      for (std::size_t i = first; i < last; ++i) {
        const Completion& c = completions[i];
        const std::span<const std::int32_t> prompt = prompts_.prompt(c.prompt);
        std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
        tokens.insert(tokens.end(), c.ids.begin(), c.ids.end());
        std::vector<std::uint8_t> mask(tokens.size(), 0);
        std::fill(mask.begin() + static_cast<std::ptrdiff_t>(prompt.size()), mask.end(), 1);
        if (builder.add(tokens, mask) < 0)
          throw core::internal_error("rollout: a completion did not fit in its row");
      }
      const data::Batch batch = builder.finish_packed(data::kPackedRowAlignment);
      const std::vector<float> values = log_probabilities(model_, true, batch);
      std::size_t t = 0;  // the counted positions, completion after completion
      for (std::size_t i = first; i < last; ++i) {
        Completion& c = completions[i];
        c.old_logprobs.clear();
        while (c.old_logprobs.size() < c.ids.size()) {
          while (batch.loss_mask[t] == 0) ++t;
          c.old_logprobs.push_back(values[t++]);
        }
      }
    }
  }
}

}  // namespace l3::train::grpo
