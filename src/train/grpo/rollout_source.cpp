#include "train/grpo/rollout_source.hpp"

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

namespace l3::train::grpo {

using nlohmann::json;

namespace {

// Values gathered per completion from every rank: reward, length (the policy's tokens),
// truncated, policy turns, tool calls; then the reward's parts.
constexpr std::size_t kFixedValues = 5;

// Every reward finite and every sum the advantages take (means, standard deviations) too: finite
// rewards near 1e308 overflow a group's mean into inf, and the step would be skipped silently.
// The same table on every rank: rank 0 says it, the others follow.
void check_representable(const dist::World& world, std::span<const double> rewards,
                         const Advantages& adv, std::span<const std::int64_t> prompts,
                         std::int64_t group, std::int64_t step) {
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      for (std::size_t i = 0; i < rewards.size(); ++i) {
        const bool sums = std::isfinite(adv.values[i]) &&
                          std::isfinite(adv.group_std[i / static_cast<std::size_t>(group)]);
        if (std::isfinite(rewards[i]) && sums) continue;
        throw core::bad_input(fmt::format(
            "step {}: the rewards of prompt {} ({:g}, summed over the reward functions with their "
            "weights) {}: keep rewards within +-1e150 or so",
            step + 1, prompts[i / static_cast<std::size_t>(group)], rewards[i],
            std::isfinite(rewards[i]) ? "overflow the group's mean or standard deviation"
                                      : "are not finite"));
      }
      if (!std::isfinite(adv.batch_std)) {
        throw core::bad_input(fmt::format(
            "step {}: the rewards overflow the batch's standard deviation: keep rewards within "
            "+-1e150 or so",
            step + 1));
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
}

double mean_of(std::span<const double> v) {
  double s = 0.0;
  for (const double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

}  // namespace

std::int64_t engine_slots(std::int64_t prompts_per_step, std::int64_t num_generations, int ranks) {
  return std::clamp<std::int64_t>(prompts_per_step / std::max(ranks, 1) * num_generations, 1, 64);
}

RolloutSource::RolloutSource(const dist::World& world, const core::Logger& log,
                             model::LlamaModel& model, ReferencePolicy reference, PromptSet prompts,
                             PromptSet validation, RolloutConfig config)
    : world_(world),
      log_(log),
      model_(model),
      reference_(reference),
      prompts_(std::move(prompts)),
      validation_(std::move(validation)),
      config_(std::move(config)),
      tokenizer_(tokenizer::Tokenizer::load(config_.tokenizer)) {
  const GrpoSettings& s = config_.settings;
  const std::int64_t longest_prompt = config_.seq_len - s.max_completion_length;
  for (std::int64_t i = 0; i < prompts_.size(); ++i) {
    if (static_cast<std::int64_t>(prompts_.prompt(i).size()) <= longest_prompt) {
      usable_.push_back(i);
    } else {
      ++skipped_;
    }
  }
  if (usable_.empty()) {
    throw core::usage_error(fmt::format(
        "no prompt of {} fits in --seq-len {} with --max-completion-length {} (the longest "
        "prompt that fits has {} tokens)",
        prompts_.directory(), config_.seq_len, s.max_completion_length,
        std::max<std::int64_t>(longest_prompt, 0)));
  }
  if (skipped_ > 0) {
    log_.warn(
        "{} of {} prompts are longer than --seq-len - --max-completion-length = {} tokens: "
        "left out",
        skipped_, prompts_.size(), longest_prompt);
  }
  if (s.reward_match_answer) {
    // Every record must say what it expects: found now, not at the step that draws it.
    for (const PromptSet* set : {&prompts_, &validation_}) {
      for (std::int64_t i = 0; i < set->size(); ++i) {
        if (!expected_answer(core::parse_json(set->record(i), "", {}))) {
          throw core::bad_input(
              fmt::format(R"(--reward-match answer: prompt {} has no "answer" that is a string or )"
                          "a number",
                          i),
              {.file = set->directory()});
        }
      }
    }
  }
  // Asynchronous GRPO's training ranks score only what they evaluate.
  const bool scores = config_.link == nullptr || config_.generate || validation_.size() > 0;
  if (!s.reward_command.empty() && scores)
    command_ = std::make_unique<RewardCommand>(s.reward_command, s.reward_timeout, config_.stop);
  if (!s.environment.empty() && scores) {
    environment_ = std::make_unique<Environment>(s.environment, s.reward_timeout, config_.stop);
    episodes_ = std::make_unique<EpisodeRunner>(
        *environment_, tokenizer_,
        EpisodeLimits{.max_turns = s.turns(),
                      .max_tokens = s.max_completion_length,
                      .fault_rank = config_.link != nullptr ? config_.link->rank : world_.rank()});
  }
  if (!s.reward_model.empty() && scores) {
    reward_model_ =
        std::make_unique<RewardModel>(world_, log_, model_.ops(),
                                      RewardModelConfig{.path = s.reward_model,
                                                        .adapter = s.reward_adapter,
                                                        .sharded = config_.shard_parameters,
                                                        .rows = config_.micro_batch,
                                                        .seq_len = config_.seq_len},
                                      tokenizer_);
  }
  if (s.beta > 0 && reference_.model == nullptr && !config_.generate)
    throw core::internal_error("GRPO with beta > 0 and no reference policy");

  // The engine: this rank's completions of a step in flight at once (at most 64), each a prompt
  // and its completion within one row.
  if (config_.prompts_per_step % world_.size() != 0) {
    throw core::usage_error(fmt::format(
        "--global-batch {} (prompts per step) must be a multiple of the {} {}ranks: a prompt's "
        "completions are generated and trained on one rank",
        config_.prompts_per_step, world_.size(),
        config_.link == nullptr ? "" : (config_.generate ? "generating " : "training ")));
  }
  model::SamplingSettings sampling{
      .temperature = s.temperature,
      .top_p = s.top_p,
      .top_k = s.top_k,
      .seed = 0,
      .stop_tokens = {tokenizer_.special(tokenizer::Special::end_of_turn),
                      tokenizer_.special(tokenizer::Special::end_of_text)},
      .vocab_limit = tokenizer_.vocab_size(),
      .tempered_logprobs = s.tempered_logprobs};
  model::validate(sampling);
  sampling_ = sampling;
  engine_ = std::make_unique<model::GenerationEngine>(
      model_,
      model::EngineShape{.slots = static_cast<int>(engine_slots(config_.prompts_per_step,
                                                                s.num_generations, world_.size())),
                         .capacity = config_.seq_len},
      std::move(sampling));
}

RolloutSource::~RolloutSource() {
  // A training rank leaving on an error: the generating ranks wait for a control message; let
  // them go (they report the run as stopped). Nothing may throw from here.
  if (config_.link != nullptr && !config_.generate && !ended_) {
    try {
      leaving_on_error_ = true;
      end_run(true);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the error on its way out is what counts
    }
  }
}

std::optional<std::int64_t> RolloutSource::steps_in_epoch(std::int64_t /*epoch*/) const {
  // Each generation batch trains --num-iterations steps.
  const auto n = static_cast<std::int64_t>(usable_.size());
  return (n + config_.prompts_per_step - 1) / config_.prompts_per_step *
         config_.settings.num_iterations;
}

void RolloutSource::start(const StepShape& shape, data::Position from) {
  position_ = from;
  pad_ = shape.pad_id;
  std::exception_ptr failure;  // rank 0's, agreed by every rank
  try {
    open_log(shape.resumed_at);
    if (world_.is_root() && !config_.cache_dir.empty()) check_rollout_cache(config_.cache_dir);
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world_, failure);
}

std::pair<std::int64_t, std::int64_t> RolloutSource::share(std::int64_t n, int rank) const {
  // The r-th 1/W of a full step's prompts; a short last step fills the first ranks' shares.
  const std::int64_t per = config_.prompts_per_step / world_.size();
  const std::int64_t begin = std::min(n, per * rank);
  return {begin, std::min(n, begin + per)};
}

std::vector<std::int64_t> RolloutSource::step_prompts(std::int64_t epoch, std::int64_t step) const {
  const auto n = static_cast<std::int64_t>(usable_.size());
  const std::vector<std::int64_t> order = data::epoch_permutation(n, config_.seed, epoch);
  std::vector<std::int64_t> out;
  for (std::int64_t i = step * config_.prompts_per_step;
       i < std::min(n, (step + 1) * config_.prompts_per_step); ++i) {
    out.push_back(usable_[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])]);
  }
  return out;
}

std::vector<RolloutSource::Completion> RolloutSource::generate(
    const PromptSet& set, const std::vector<std::int64_t>& mine, std::int64_t samples,
    const model::SamplingSettings& sampling) {
  const core::TraceRange range("rollout: generate");
  const GrpoSettings& s = config_.settings;
  engine_->set_sampling(sampling);
  // Every rank runs the engine's passes together: with sharded weights a pass gathers them.
  const model::GenerationEngine::PassAgreement agree = [&](bool work) {
    return dist::all_reduce(world_.comm(), work ? 1 : 0, dist::ReduceOp::max, "rollout pass") > 0;
  };
  environment_ms_ = 0.0;
  if (episodes_) {
    // An environment's failure on one rank ends that rank's episodes; every rank then throws it.
    EpisodeOutcome outcome;
    std::vector<Completion> out = episodes_->run(*engine_, set, mine, samples, agree, outcome);
    dist::agree_on_failure(world_, outcome.failure);
    environment_ms_ = outcome.environment_ms;
    return out;
  }
  std::unordered_map<std::int64_t, std::size_t> position;  // a prompt appears once
  for (std::size_t i = 0; i < mine.size(); ++i) position[mine[i]] = i;
  const auto per = static_cast<std::size_t>(samples);
  std::vector<Completion> out(mine.size() * per);
  std::size_t next = 0;
  const model::GenerationEngine::RequestSource source =
      [&]() -> std::optional<model::GenerationRequest> {
    if (next == out.size()) return std::nullopt;
    const std::size_t i = next++;
    const std::int64_t prompt = mine[i / per];
    const std::span<const std::int32_t> ids = set.prompt(prompt);
    return model::GenerationRequest{.record = prompt,
                                    .sample = static_cast<std::int64_t>(i % per),
                                    .prompt = std::vector<std::int32_t>(ids.begin(), ids.end()),
                                    .max_new = s.max_completion_length};
  };
  const model::GenerationEngine::OutputSink sink = [&](model::GenerationOutput&& o) {
    Completion& c = out[position.at(o.record) * per + static_cast<std::size_t>(o.sample)];
    c.prompt = o.record;
    c.sample = o.sample;
    c.text = tokenizer_.decode(o.tokens);
    c.ids = std::move(o.tokens);
    c.logprobs = std::move(o.logprobs);
    if (o.stop_token >= 0) {
      c.ids.push_back(o.stop_token);
      c.logprobs.push_back(o.stop_logprob);
    }
    c.truncated = !o.stopped;
  };
  engine_->run(source, sink, {}, agree);
  return out;
}

void RolloutSource::score(const PromptSet& set, std::vector<Completion>& completions) {
  const core::TraceRange range("rollout: score");
  const GrpoSettings& s = config_.settings;
  std::vector<json> records;
  records.reserve(completions.size());
  for (const Completion& c : completions)
    records.push_back(core::parse_json(set.record(c.prompt), "", {}));
  const auto name = [&](const Completion& c) {
    return fmt::format("prompt {} of {} (sample {})", c.prompt, set.directory(), c.sample);
  };
  // The rewards of this rank alone first: a failing verifier stops every rank (with its
  // message) before the reward model's passes, which are collective.
  std::exception_ptr failure;
  try {
    for (std::size_t i = 0; i < completions.size(); ++i) {
      Completion& c = completions[i];
      const json& record = records[i];
      c.rewards.clear();
      if (environment_) c.rewards.push_back(c.environment_reward);
      if (s.reward_match_answer) c.rewards.push_back(answer_match(record, c.text));
      if (command_) {
        const json request = {
            {"prompt",
             record.contains("prompt") ? record["prompt"] : record.value("messages", json())},
            {"completion", c.text},
            {"record", record}};
        c.rewards.push_back(
            command_->score(request.dump(-1, ' ', false, json::error_handler_t::replace), name(c)));
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world_, failure);
  if (reward_model_) {
    std::vector<RewardModelRequest> requests;
    requests.reserve(completions.size());
    for (std::size_t i = 0; i < completions.size(); ++i)
      requests.push_back({.record = &records[i],
                          .completion = &completions[i].text,
                          .name = name(completions[i])});
    const std::vector<double> rewards = reward_model_->score(requests);
    for (std::size_t i = 0; i < completions.size(); ++i)
      completions[i].rewards.push_back(rewards[i]);
  }
  for (Completion& c : completions) {
    c.reward = 0.0;
    for (std::size_t k = 0; k < c.rewards.size(); ++k)
      c.reward += (s.reward_weights.empty() ? 1.0 : s.reward_weights[k]) * c.rewards[k];
  }
}

void RolloutSource::finish() {
  std::exception_ptr failure;
  try {
    if (command_) command_->finish();
    if (environment_) environment_->finish();
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world_, failure);
}

const data::StepData& RolloutSource::next() {
  const std::int64_t iterations = config_.settings.num_iterations;
  const std::int64_t per_epoch = *steps_in_epoch(position_.epoch);
  const std::int64_t step = position_.epoch * per_epoch + position_.step;  // global, from 0
  // The generation batch of this step: made now, kept from the cycle's first step, or (a run
  // resumed inside a cycle) read back from where that step saved it.
  const std::int64_t cycle = step - step % iterations;
  if (config_.link != nullptr) {
    linked_next(step);
  } else if (step == cycle) {
    roll_out(step);
  } else if (cycle_ != cycle) {
    restore_cycle(cycle);
  }
  current_.position = position_;
  current_.metrics = cycle_metrics_;
  if (iterations > 1) {
    for (auto& [name, value] : current_.metrics) {
      // Nothing generated, waited for or sent now.
      if (step != cycle && (name.starts_with("time/") || name == "weights/bytes" ||
                            (name.starts_with("generation/") && name.ends_with("_ms"))))
        value = 0.0;
      if (name == "staleness")
        value = static_cast<double>(step - config_.settings.behaviour_version(step));
    }
    current_.metrics.emplace_back("iteration", static_cast<double>(step - cycle));
  }
  position_ = position_.step + 1 < per_epoch ? data::Position{position_.epoch, position_.step + 1}
                                             : data::Position{position_.epoch + 1, 0};
  current_.next = position_;
  return current_;
}

void RolloutSource::roll_out(std::int64_t step) {
  Rolled rolled = generate_batch(step);
  use_batch(std::move(rolled.completions), std::move(rolled.metrics), step);
}

RolloutSource::Rolled RolloutSource::generate_batch(std::int64_t step) {
  const GrpoSettings& s = config_.settings;
  const std::vector<std::int64_t> all =
      step_prompts(position_.epoch, position_.step / s.num_iterations);
  const auto [begin, end] = share(static_cast<std::int64_t>(all.size()), world_.rank());
  const std::vector<std::int64_t> mine(all.begin() + begin, all.begin() + end);

  core::Stopwatch watch;
  model::SamplingSettings sampling = sampling_;
  sampling.seed = core::CounterRng(config_.seed, core::RngPurpose::grpo_sampling,
                                   static_cast<std::uint32_t>(step))
                      .bits64(0);
  std::vector<Completion> completions = generate(prompts_, mine, s.num_generations, sampling);
  const double generate_ms = watch.milliseconds();
  core::fault_point("grpo.generated", config_.link != nullptr ? config_.link->rank : world_.rank());
  watch = core::Stopwatch();
  score(prompts_, completions);
  const double score_ms = watch.milliseconds();
  core::fault_point("grpo.scored", config_.link != nullptr ? config_.link->rank : world_.rank());

  // Every rank's rewards, lengths and truncations in the step's global order.
  const std::size_t functions = s.reward_names().size();
  const std::size_t width = kFixedValues + functions;
  const auto g = static_cast<std::size_t>(s.num_generations);
  std::vector<int> counts(static_cast<std::size_t>(world_.size()));
  std::vector<int> displacements(counts.size());
  for (int r = 0; r < world_.size(); ++r) {
    const auto [b, e] = share(static_cast<std::int64_t>(all.size()), r);
    counts[static_cast<std::size_t>(r)] =
        static_cast<int>(static_cast<std::size_t>(e - b) * g * width);
    displacements[static_cast<std::size_t>(r)] =
        static_cast<int>(static_cast<std::size_t>(b) * g * width);
  }
  std::vector<double> table(all.size() * g * width);
  for (std::size_t i = 0; i < completions.size(); ++i) {
    const Completion& c = completions[i];
    double* row = table.data() + static_cast<std::size_t>(begin) * g * width + i * width;
    row[0] = c.reward;
    row[1] = static_cast<double>(c.policy_tokens());
    row[2] = c.truncated ? 1.0 : 0.0;
    row[3] = static_cast<double>(c.turns);
    row[4] = static_cast<double>(c.tool_calls);
    for (std::size_t k = 0; k < functions; ++k) row[kFixedValues + k] = c.rewards[k];
  }
  dist::all_gatherv(world_.comm(), std::span<double>(table), counts, displacements,
                    "rollout rewards");
  const std::size_t n = all.size() * g;
  std::vector<double> rewards(n);
  for (std::size_t i = 0; i < n; ++i) rewards[i] = table[i * width];
  const Advantages adv =
      compute_advantages(rewards, s.num_generations, s.advantage, s.scale_rewards);
  check_representable(world_, rewards, adv, all, s.num_generations, step);
  for (std::size_t i = 0; i < completions.size(); ++i)
    completions[i].advantage = adv.values[static_cast<std::size_t>(begin) * g + i];

  // The step's metrics, TRL's names; the same on every rank (computed from the same table).
  std::vector<std::pair<std::string, double>> metrics;
  metrics.reserve(16 + 2 * functions);  // (also keeps GCC 12's -Warray-bounds from a false alarm)
  metrics.emplace_back("reward", mean_of(rewards));
  metrics.emplace_back("reward_std", unbiased_std(rewards));
  metrics.emplace_back("frac_reward_zero_std", adv.frac_zero_std);
  const std::vector<std::string> names = s.reward_names();
  for (std::size_t k = 0; k < functions; ++k) {
    std::vector<double> values(n);
    for (std::size_t i = 0; i < n; ++i) values[i] = table[i * width + kFixedValues + k];
    metrics.emplace_back(fmt::format("rewards/{}/mean", names[k]), mean_of(values));
    metrics.emplace_back(fmt::format("rewards/{}/std", names[k]), unbiased_std(values));
  }
  std::vector<double> lengths(n);
  std::vector<double> terminated;
  for (std::size_t i = 0; i < n; ++i) {
    lengths[i] = table[i * width + 1];
    if (table[i * width + 2] == 0.0) terminated.push_back(lengths[i]);
  }
  const auto [shortest, longest] = std::minmax_element(lengths.begin(), lengths.end());
  metrics.emplace_back("completions/mean_length", mean_of(lengths));
  metrics.emplace_back("completions/min_length", n > 0 ? *shortest : 0.0);
  metrics.emplace_back("completions/max_length", n > 0 ? *longest : 0.0);
  metrics.emplace_back(
      "completions/clipped_ratio",
      n > 0 ? 1.0 - static_cast<double>(terminated.size()) / static_cast<double>(n) : 0.0);
  const auto [t_min, t_max] = std::minmax_element(terminated.begin(), terminated.end());
  metrics.emplace_back("completions/mean_terminated_length", mean_of(terminated));
  metrics.emplace_back("completions/min_terminated_length", terminated.empty() ? 0.0 : *t_min);
  metrics.emplace_back("completions/max_terminated_length", terminated.empty() ? 0.0 : *t_max);
  if (environment_) {
    // Episodes: the policy's turns, the environment's tool results ("ipython" messages) per
    // episode, and the policy's tokens per turn over the step.
    double turns = 0.0;
    double most = 0.0;
    double calls = 0.0;
    double tokens = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      turns += table[i * width + 3];
      most = std::max(most, table[i * width + 3]);
      calls += table[i * width + 4];
      tokens += lengths[i];
    }
    const double episodes = std::max<double>(static_cast<double>(n), 1.0);
    metrics.emplace_back("turns/mean", turns / episodes);
    metrics.emplace_back("turns/max", most);
    metrics.emplace_back("tools/call_frequency", calls / episodes);
    metrics.emplace_back("tokens_per_turn", turns > 0 ? tokens / turns : 0.0);
  }
  // Generating ranks time their own work (generation/...): the training ranks' step time does
  // not include it.
  if (config_.generate && s.staleness() > 0 && s.importance_sampling_correction) {
    watch = core::Stopwatch();
    behaviour_log_probabilities(completions);
    metrics.emplace_back("generation/behaviour_ms",
                         dist::all_reduce(world_.comm(), watch.milliseconds(), dist::ReduceOp::max,
                                          "behaviour time"));
  }
  const std::string prefix = config_.generate ? "generation/" : "time/";
  // The environment's answers came during the generation: its own share, not the engine's.
  std::array<double, 2> times{generate_ms - environment_ms_, environment_ms_};
  dist::all_reduce(world_.comm(), std::span<double>(times), dist::ReduceOp::max, "generate time");
  metrics.emplace_back(prefix + "generate_ms", times[0]);
  if (environment_) metrics.emplace_back(prefix + "environment_ms", times[1]);
  metrics.emplace_back(prefix + "score_ms", dist::all_reduce(world_.comm(), score_ms,
                                                             dist::ReduceOp::max, "score time"));
  return {std::move(completions), std::move(metrics)};
}

void RolloutSource::use_batch(std::vector<Completion> completions,
                              std::vector<std::pair<std::string, double>> metrics,
                              std::int64_t step) {
  const GrpoSettings& s = config_.settings;
  if (!s.log_completions.empty()) write_log(completions, step);
  current_ = data::StepData{};
  current_.samples = static_cast<std::int64_t>(completions.size()) / s.num_generations;
  build_batches(completions);
  {
    // What one pass over the step's micro-batches computes (every rank's): positions, padding
    // included, and the share of them that is padding (packed: at most 15 per micro-batch).
    std::array<double, 2> tokens{0.0, 0.0};
    for (const data::Batch& b : current_.micro) {
      tokens[0] += static_cast<double>(b.tokens_count());
      tokens[1] += static_cast<double>(b.document_tokens);
    }
    dist::all_reduce(world_.comm(), std::span<double>(tokens), dist::ReduceOp::sum,
                     "rollout tokens");
    metrics.emplace_back("train_tokens", tokens[0]);
    metrics.emplace_back("train_padding_share", tokens[0] > 0 ? 1.0 - tokens[1] / tokens[0] : 0.0);
  }
  if (reference_.model != nullptr) {
    const core::Stopwatch watch;
    reference_log_probabilities(completions);
    metrics.emplace_back("time/reference_ms",
                         dist::all_reduce(world_.comm(), watch.milliseconds(), dist::ReduceOp::max,
                                          "reference time"));
  }
  if (s.num_iterations > 1) {
    // The cycle's old log-probabilities: the training ranks' pass at its first step. With
    // --generation-ranks and a lag they are the behaviour policy's, which came with the batch
    // (or, without the correction, the generator's own); on-policy (S = 0) that policy is this
    // one, and the pass is the synchronous run's.
    const bool linked = config_.link != nullptr;
    if (!linked || s.staleness() == 0) old_log_probabilities(completions);
    if (!config_.cache_dir.empty()) save_cycle(completions, metrics, step, /*prune=*/!linked);
  }
  cycle_ = step;
  cycle_metrics_ = std::move(metrics);
}

std::optional<EvalMetrics> RolloutSource::evaluate() {
  const core::Stopwatch watch;
  const GrpoSettings& s = config_.settings;
  // This rank's contiguous share of the prompts that fit.
  std::vector<std::int64_t> fitting;
  for (std::int64_t i = 0; i < validation_.size(); ++i) {
    if (static_cast<std::int64_t>(validation_.prompt(i).size()) <=
        config_.seq_len - s.max_completion_length)
      fitting.push_back(i);
  }
  const auto n = static_cast<std::int64_t>(fitting.size());
  const std::int64_t begin = n * world_.rank() / world_.size();
  const std::int64_t end = n * (world_.rank() + 1) / world_.size();
  const std::vector<std::int64_t> mine(fitting.begin() + begin, fitting.begin() + end);

  model::SamplingSettings greedy = sampling_;
  greedy.temperature = 0.0;
  model::SamplingSettings sampled = sampling_;
  // The same draws at every evaluation: the curve follows the model, not the dice.
  sampled.seed =
      core::CounterRng(config_.seed, core::RngPurpose::grpo_sampling, 0xffffffffU).bits64(0);
  std::vector<Completion> first = generate(validation_, mine, 1, greedy);
  std::vector<Completion> second = generate(validation_, mine, s.num_generations, sampled);
  score(validation_, first);
  score(validation_, second);

  // Sums over the ranks: greedy rewards, sampled rewards, greedy lengths, then each function's
  // greedy rewards.
  const std::size_t functions = s.reward_names().size();
  std::vector<double> sums(3 + functions, 0.0);
  for (const Completion& c : first) {
    sums[0] += c.reward;
    sums[2] += static_cast<double>(c.policy_tokens());
    for (std::size_t k = 0; k < functions; ++k) sums[3 + k] += c.rewards[k];
  }
  for (const Completion& c : second) sums[1] += c.reward;
  dist::all_reduce(world_.comm(), std::span<double>(sums), dist::ReduceOp::sum, "eval rewards");
  const double prompts = static_cast<double>(std::max<std::int64_t>(n, 1));
  EvalMetrics m;
  m.phase = Phase::grpo;
  m.skipped_samples = validation_.size() - n;
  m.extra.reserve(4 + functions);  // (also keeps GCC 12's -Warray-bounds from a false alarm)
  m.extra.emplace_back("reward", sums[0] / prompts);
  m.extra.emplace_back("reward_sampled",
                       sums[1] / (prompts * static_cast<double>(s.num_generations)));
  const std::vector<std::string> names = s.reward_names();
  for (std::size_t k = 0; k < functions; ++k)
    m.extra.emplace_back(fmt::format("rewards/{}/mean", names[k]), sums[3 + k] / prompts);
  m.extra.emplace_back("completions/mean_length", sums[2] / prompts);
  m.extra.emplace_back("prompts", static_cast<double>(n));
  m.seconds = watch.seconds();
  return m;
}

void RolloutSource::build_batches(const std::vector<Completion>& completions) {
  const GrpoSettings& s = config_.settings;
  placement_.clear();
  // Every rank runs the same number of micro-batches (a short share: empty ones), so that the
  // passes' collectives (ZeRO-3 gathers) match.
  const std::int64_t per_rank = config_.prompts_per_step / world_.size() * s.num_generations;
  const std::int64_t passes = (per_rank + config_.micro_batch - 1) / config_.micro_batch;
  for (std::int64_t m = 0; m < passes; ++m) {
    const std::int64_t first = m * config_.micro_batch;
    const std::int64_t last = std::min<std::int64_t>(static_cast<std::int64_t>(completions.size()),
                                                     first + config_.micro_batch);
    if (first >= last) {
      current_.micro.push_back(data::Batch::none(config_.seq_len));
      continue;
    }
    // Packed: the completions end to end in one row, each with its prompt a segment of its own
    // (no token attends to another completion), the row cut after the last one. Padded
    // (--pad-completions): one completion per row of --seq-len.
    const bool packed = s.pack_completions;
    data::BatchBuilder builder(packed ? 1 : last - first,
                               packed ? (last - first) * config_.seq_len : config_.seq_len, pad_);
    struct Placed {
      std::int64_t end = 0;  // flat position of the last token
      std::size_t completion = 0;
    };
    std::vector<Placed> placed;
    std::int64_t counted = 0;
    for (std::int64_t i = first; i < last; ++i) {
      const Completion& c = completions[static_cast<std::size_t>(i)];
      const std::span<const std::int32_t> prompt = prompts_.prompt(c.prompt);
      std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
      tokens.insert(tokens.end(), c.ids.begin(), c.ids.end());
      // The loss counts the policy's tokens (an episode's environment tokens are context).
      const bool masked = s.mask_truncated_completions && c.truncated;
      std::vector<std::uint8_t> mask(tokens.size(), 0);
      if (!masked) {
        for (std::size_t k = 0; k < c.ids.size(); ++k)
          mask[prompt.size() + k] = c.is_policy(k) ? 1 : 0;
      }
      const std::int64_t end = builder.add(tokens, mask);
      if (end < 0) throw core::internal_error("rollout: a completion did not fit in its row");
      if (!packed) builder.end_row();
      placed.push_back({end, static_cast<std::size_t>(i)});
      if (!masked) counted += c.policy_tokens();
    }
    data::Batch batch =
        packed ? builder.finish_packed(data::kPackedRowAlignment) : builder.finish();
    const std::size_t positions = static_cast<std::size_t>(batch.tokens_count());
    batch.advantages.assign(positions, 0.0F);
    batch.sampled_logprobs.assign(positions, 0.0F);
    batch.loss_weights.assign(positions, 0.0F);
    batch.completions = last - first;
    const bool old = !completions[placed.front().completion].old_logprobs.empty();
    if (old) batch.old_logprobs.assign(positions, 0.0F);
    const bool ref = !completions[placed.front().completion].ref_logprobs.empty();
    if (ref) batch.ref_logprobs.assign(positions, 0.0F);
    for (const Placed& p : placed) {
      const Completion& c = completions[p.completion];
      const auto length = static_cast<std::int64_t>(c.ids.size());
      // Position t predicts token t + 1: the completion's k-th token is the target of the
      // position before it.
      const std::int64_t first_target = p.end - length;
      placement_[p.completion] = {static_cast<std::size_t>(m), first_target};
      const float weight =
          s.loss_type == PolicyLossType::grpo
              ? 1.0F / static_cast<float>(std::max<std::int64_t>(c.policy_tokens(), 1))
          : s.loss_type == PolicyLossType::bnpo
              ? 1.0F / static_cast<float>(std::max<std::int64_t>(counted, 1))
              : 1.0F;
      for (std::int64_t k = 0; k < length; ++k) {
        if (!c.is_policy(static_cast<std::size_t>(k))) continue;  // context: nothing to learn
        const auto t = static_cast<std::size_t>(first_target + k);
        batch.advantages[t] = static_cast<float>(c.advantage);
        batch.sampled_logprobs[t] = c.logprobs[static_cast<std::size_t>(k)];
        batch.loss_weights[t] = weight;
        if (old) batch.old_logprobs[t] = c.old_logprobs[static_cast<std::size_t>(k)];
        if (ref) batch.ref_logprobs[t] = c.ref_logprobs[static_cast<std::size_t>(k)];
      }
    }
    current_.micro.push_back(std::move(batch));
  }
}

std::vector<float> RolloutSource::log_probabilities(model::LlamaModel& model, bool adapters,
                                                    const data::Batch& batch) {
  const std::vector<float> counted =
      model.target_log_probs(batch, config_.settings.logit_scale(), adapters);
  std::vector<float> out;
  if (batch.tokens_count() == 0) return out;
  out.assign(batch.loss_mask.size(), 0.0F);
  std::size_t c = 0;
  for (std::size_t t = 0; t < batch.loss_mask.size(); ++t) {
    if (batch.loss_mask[t] != 0) out[t] = counted[c++];
  }
  return out;
}

std::vector<float> RolloutSource::completion_values(std::vector<float> data::Batch::*field,
                                                    std::size_t completion,
                                                    std::size_t length) const {
  const auto [micro, first] = placement_.at(completion);
  const std::vector<float>& values = current_.micro[micro].*field;
  const auto from = values.begin() + first;
  return {from, from + static_cast<std::ptrdiff_t>(length)};
}

void RolloutSource::old_log_probabilities(std::vector<Completion>& completions) {
  // The trainer's own forward pass over each micro-batch, as the first update of the cycle will
  // run it: there the ratio is exactly 1; later it is pi / pi_old. Every rank runs every
  // micro-batch (empty ones without rows) for the passes' collectives.
  const core::TraceRange range("rollout: old log-probabilities");
  for (data::Batch& batch : current_.micro)
    batch.old_logprobs = log_probabilities(model_, true, batch);
  for (std::size_t i = 0; i < completions.size(); ++i) {
    completions[i].old_logprobs =
        completion_values(&data::Batch::old_logprobs, i, completions[i].ids.size());
  }
}

void RolloutSource::reference_log_probabilities(std::vector<Completion>& completions) {
  // Once per generation batch, as TRL does, with the micro-batches the training runs: a
  // reference that is the initial model gives, at step 1, what the policy gives (KL 0).
  const core::TraceRange range("rollout: reference log-probabilities");
  for (data::Batch& batch : current_.micro)
    batch.ref_logprobs = log_probabilities(*reference_.model, reference_.adapters, batch);
  for (std::size_t i = 0; i < completions.size(); ++i) {
    completions[i].ref_logprobs =
        completion_values(&data::Batch::ref_logprobs, i, completions[i].ids.size());
  }
}

}  // namespace l3::train::grpo
