// RolloutSource's files: the generation batches of CKPT_DIR/rollouts (rollout_cache.hpp) as text
// and back, and --log-completions.
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
void RolloutSource::open_log(std::optional<std::int64_t> resumed_at) {
  if (config_.settings.log_completions.empty() || !world_.is_root()) return;
  log_file_ = std::make_unique<CompletionsLog>(config_.settings.log_completions, resumed_at);
  if (log_file_->dropped() > 0) {
    log_.info("{}: dropped the {} completions the interrupted run logged after step {}",
              log_file_->path(), log_file_->dropped(), *resumed_at);
  }
}

std::string RolloutSource::cycle_file(std::int64_t step) const {
  return (std::filesystem::path(config_.cache_dir) / rollout_file_name(step)).string();
}

std::string RolloutSource::batch_text(const std::vector<Completion>& completions,
                                      const std::vector<std::pair<std::string, double>>& metrics,
                                      std::int64_t step) {
  // Every rank's completions in the global order (rank by rank): a run resumed inside the
  // cycle, on any number of ranks, trains on the same batch.
  json mine = json::array();
  for (const Completion& c : completions) {
    json& saved = mine.emplace_back(json{{"prompt", c.prompt},
                                         {"sample", c.sample},
                                         {"ids", c.ids},
                                         {"logprobs", c.logprobs},
                                         {"old_logprobs", c.old_logprobs},
                                         {"ref_logprobs", c.ref_logprobs},
                                         {"truncated", c.truncated},
                                         {"text", c.text},
                                         {"rewards", c.rewards},
                                         {"reward", c.reward},
                                         {"advantage", c.advantage}});
    if (!c.policy.empty()) {  // a multi-turn episode: the whole conversation
      saved["policy"] = c.policy;
      saved["turns"] = c.turns;
      saved["tool_calls"] = c.tool_calls;
      saved["conversation"] = c.conversation;
      saved["environment_reward"] = c.environment_reward;
    }
  }
  const std::vector<std::string> parts = dist::gather_strings(
      world_.comm(), mine.dump(-1, ' ', false, json::error_handler_t::replace), 0);
  if (!world_.is_root()) return {};
  json all = json::array();
  for (const std::string& part : parts)
    for (json& c : json::parse(part)) all.push_back(std::move(c));
  json metric_object = json::object();
  for (const auto& [name, value] : metrics) metric_object[name] = value;
  return json{{"step", step}, {"metrics", metric_object}, {"completions", all}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

void RolloutSource::save_cycle(const std::vector<Completion>& completions,
                               const std::vector<std::pair<std::string, double>>& metrics,
                               std::int64_t step, bool prune) {
  const std::string text = batch_text(completions, metrics, step);
  std::exception_ptr failure;
  if (world_.is_root()) {
    try {
      check_rollout_cache(config_.cache_dir);  // again: planted while the run went on
      std::filesystem::create_directories(config_.cache_dir);
      core::write_file_atomically(cycle_file(step), text);
      if (prune) {
        // Older cycles' files go once no checkpoint can resume inside them: those before the
        // cycle of the oldest checkpoint kept. Checkpoints are written in the background: while
        // no checkpoint is complete, the first one may still be in flight and need an older
        // cycle's file (the step-3 checkpoint of --num-iterations 2 needs the batch of step 3,
        // which a prune at step 5 deleted), so nothing goes before one is complete; later ones
        // in flight are newer than the oldest complete one and need nothing older.
        std::optional<std::int64_t> oldest;
        for (const auto& entry : std::filesystem::directory_iterator(
                 std::filesystem::path(config_.cache_dir).parent_path())) {
          const std::string name = entry.path().filename().string();
          if (name.starts_with("step-") && name.size() == 13 &&
              name.find_first_not_of("0123456789", 5) == std::string::npos)
            oldest = std::min<std::int64_t>(oldest.value_or(step), std::stoll(name.substr(5)));
        }
        const std::int64_t keep =
            oldest ? *oldest - *oldest % config_.settings.num_iterations : std::int64_t{0};
        prune_rollout_cache(config_.cache_dir, keep);
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world_, failure);
}

void RolloutSource::restore_cycle(std::int64_t cycle) {
  const GrpoSettings& s = config_.settings;
  const std::string path = cycle_file(cycle);
  std::exception_ptr failure;
  std::string text;
  if (world_.is_root()) {
    try {
      if (config_.cache_dir.empty() || !std::filesystem::exists(path)) {
        throw core::bad_input(fmt::format("resuming inside a cycle of --num-iterations {} needs "
                                          "the generation batch of step {}, "
                                          "saved when that step ran; it is missing",
                                          s.num_iterations, cycle + 1),
                              {.file = path});
      }
      text = core::read_text_file(path, "a GRPO generation batch", std::size_t{1} << 30);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world_, failure);
  text = dist::broadcast_string(world_.comm(), text);
  std::vector<Completion> completions = parse_batch(text, cycle, path, cycle_metrics_);
  current_ = data::StepData{};
  current_.samples = static_cast<std::int64_t>(completions.size()) / s.num_generations;
  build_batches(completions);
  cycle_ = cycle;
}

std::vector<RolloutSource::Completion> RolloutSource::parse_batch(
    const std::string& text, std::int64_t cycle, const std::string& path,
    std::vector<std::pair<std::string, double>>& metrics) {
  const GrpoSettings& s = config_.settings;
  const std::vector<std::int64_t> all =
      step_prompts(position_.epoch, position_.step / s.num_iterations);
  const auto [begin, end] = share(static_cast<std::int64_t>(all.size()), world_.rank());
  const auto g = static_cast<std::size_t>(s.num_generations);
  std::vector<Completion> completions;
  metrics.clear();
  try {
    const json saved = json::parse(text);
    const json& list = saved.at("completions");
    if (saved.at("step").get<std::int64_t>() != cycle || list.size() != all.size() * g)
      throw core::bad_input("it is another step's generation batch", {.file = path});
    for (auto i = static_cast<std::size_t>(begin) * g; i < static_cast<std::size_t>(end) * g; ++i) {
      const json& c = list[i];
      Completion out;
      out.prompt = c.at("prompt").get<std::int64_t>();
      if (out.prompt != all[i / g])
        throw core::bad_input("its prompts are not this step's", {.file = path});
      out.sample = c.at("sample").get<std::int64_t>();
      out.ids = c.at("ids").get<std::vector<std::int32_t>>();
      out.logprobs = c.at("logprobs").get<std::vector<float>>();
      out.old_logprobs = c.at("old_logprobs").get<std::vector<float>>();
      out.ref_logprobs = c.at("ref_logprobs").get<std::vector<float>>();
      out.truncated = c.at("truncated").get<bool>();
      out.text = c.at("text").get<std::string>();
      out.rewards = c.at("rewards").get<std::vector<double>>();
      out.reward = c.at("reward").get<double>();
      out.advantage = c.at("advantage").get<double>();
      if (c.contains("policy")) {
        out.policy = c.at("policy").get<std::vector<std::uint8_t>>();
        out.turns = c.at("turns").get<std::int64_t>();
        out.tool_calls = c.at("tool_calls").get<std::int64_t>();
        out.conversation = c.at("conversation").get<std::string>();
        out.environment_reward = c.at("environment_reward").get<double>();
      }
      const bool episodes = !s.environment.empty();
      // Generating ranks leave the old and the reference log-probabilities to the training
      // ranks (a batch of --num-iterations 1 has no old ones; the reference's come after); a
      // cycle's batch the training ranks saved (--num-iterations > 1) has them.
      const bool linked = config_.link != nullptr;
      const std::size_t n = out.ids.size();
      const bool old_ok = out.old_logprobs.size() == n || (linked && out.old_logprobs.empty());
      const bool ref_ok = s.beta > 0
                              ? out.ref_logprobs.size() == n || (linked && out.ref_logprobs.empty())
                              : out.ref_logprobs.empty();
      if (out.logprobs.size() != n || !old_ok || !ref_ok ||
          static_cast<std::int64_t>(n) > s.max_completion_length ||
          (episodes ? out.policy.size() != n : !out.policy.empty()))
        throw core::bad_input(fmt::format("completion {} is malformed", i), {.file = path});
      for (const std::int32_t id : out.ids) {
        if (id < 0 || id >= model_.config().vocab_size)
          throw core::bad_input(fmt::format("completion {} has token id {}", i, id),
                                {.file = path});
      }
      completions.push_back(std::move(out));
    }
    for (const auto& [name, value] : saved.at("metrics").items())
      metrics.emplace_back(name, value.get<double>());
  } catch (const json::exception& e) {
    throw core::bad_input(fmt::format("not a generation batch: {}", e.what()), {.file = path});
  }
  return completions;
}

void RolloutSource::write_log(const std::vector<Completion>& completions, std::int64_t step) {
  std::string lines;
  for (const Completion& c : completions) {
    nlohmann::ordered_json line = {
        {"step", step + 1},
        {"record", nlohmann::ordered_json::parse(prompts_.record(c.prompt))},
        {"prompt_index", c.prompt},
        {"sample", c.sample},
        {"completion", c.text},
        {"ids", c.ids},
        {"truncated", c.truncated},
        {"reward", c.reward},
        {"advantage", c.advantage}};
    const std::vector<std::string> names = config_.settings.reward_names();
    for (std::size_t k = 0; k < names.size(); ++k)
      line[fmt::format("rewards/{}", names[k])] = c.rewards[k];
    if (!c.policy.empty()) {
      // A multi-turn episode: the whole conversation, and which of "ids" (every token after
      // the prompt) are the policy's, the tokens the loss counts.
      line["turns"] = c.turns;
      line["tool_calls"] = c.tool_calls;
      line["messages"] = nlohmann::ordered_json::parse(c.conversation);
      line["policy"] = c.policy;
    }
    if (config_.link != nullptr) {
      // Asynchronous GRPO: which policy generated it, the log-probabilities it drew each token
      // with, and (a lag) the trainer's forward pass of that policy: the ratio's denominator.
      line["policy_version"] = config_.settings.behaviour_version(step);
      line["logprobs"] = c.logprobs;
      if (!c.old_logprobs.empty()) line["behaviour_logprobs"] = c.old_logprobs;
    }
    lines += line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  }
  const std::vector<std::string> all = dist::gather_strings(world_.comm(), lines, 0);
  if (!world_.is_root()) return;
  for (const std::string& part : all) log_file_->append(part);
}

void RolloutSource::prune_cache(std::int64_t step) {
  // A checkpoint after c steps needs the batches of the cycles [c, first_generated_after(c))
  // (asynchronous GRPO's pending ones, and inside a cycle its own); the run needs those after
  // `step`. The rest go, once a checkpoint is complete
  // (before that, the first one may still be in flight and need its batches).
  if (config_.cache_dir.empty() || !std::filesystem::is_directory(config_.cache_dir)) return;
  std::vector<std::int64_t> checkpoints;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::filesystem::path(config_.cache_dir).parent_path())) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("step-") && name.size() == 13 &&
        name.find_first_not_of("0123456789", 5) == std::string::npos)
      checkpoints.push_back(std::stoll(name.substr(5)));
  }
  if (checkpoints.empty()) return;
  // Everything since the newest one is kept as well: a node-local checkpoint newer than it
  // (the one a restart would take) needs its batches too.
  const GrpoSettings& s = config_.settings;
  const std::int64_t newest = *std::max_element(checkpoints.begin(), checkpoints.end());
  prune_rollout_cache(config_.cache_dir, [&](std::int64_t j) {
    // Later checkpoints: from the cycle of the step after this one on.
    if (j >= s.cycle_start(step + 1) || j >= s.cycle_start(newest)) return true;
    // A checkpoint after c steps: its cycle's batch (inside a cycle) and the next S cycles'.
    return std::any_of(checkpoints.begin(), checkpoints.end(), [&](std::int64_t c) {
      return s.cycle_start(c) <= j && j < s.first_generated_after(c);
    });
  });
}

}  // namespace l3::train::grpo
