#include "train/grpo/reward_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/trace_range.hpp"
#include "dist/collectives.hpp"
#include "io/data/batch.hpp"
#include "io/prep/record_format.hpp"
#include "io/tokenizer/utf8.hpp"
#include "model/placement.hpp"
#include "train/model_source.hpp"
#include "train/objectives/bradley_terry_loss.hpp"

namespace l3::train::grpo {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The tokenizer a Hugging Face directory holds, if any.
std::optional<std::string> hf_tokenizer(const std::string& dir) {
  for (const fs::path& p :
       {fs::path(dir) / "tokenizer.json", fs::path(dir) / "original" / "tokenizer.model",
        fs::path(dir) / "tokenizer.model"}) {
    std::error_code ec;
    if (fs::exists(p, ec)) return p.string();
  }
  return std::nullopt;
}

// The text as --log-completions and a verifier see it: a weak model's completion may end inside
// a character, or be bytes that are no UTF-8 at all, which the tokenizer refuses; nlohmann's
// replacement (U+FFFD) makes it text.
std::string as_valid_utf8(const std::string& text) {
  if (!tokenizer::first_invalid_utf8(text)) return text;
  return json::parse(json(text).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

}  // namespace

RewardModel::RewardModel(const dist::World& world, const core::Logger& log, kernels::Ops& ops,
                         const RewardModelConfig& config,
                         const tokenizer::Tokenizer& policy_tokenizer)
    : world_(world), config_(config) {
  ModelSource source;
  std::exception_ptr failure;
  try {
    source = resolve_model_source("", config_.path);
    origin_ = source.origin();
    // A reward adapter (PEFT's SEQ_CLS) brings its score head: its base may be a language model.
    if (source.initial_head() != model::HeadKind::reward && config_.adapter.empty()) {
      throw core::bad_input(
          "--reward-model: this is a language model (lm_head), not a reward model (score head); "
          "give a reward checkpoint, or its base with --reward-adapter DIR",
          {.file = origin_});
    }
    // Its own tokenizer: the one it was trained with, which is often the policy's.
    std::string spec;
    std::string sha256;
    if (source.checkpoint) {
      spec = source.checkpoint->tokenizer;
      sha256 = source.checkpoint->tokenizer_sha256;
    } else if (const std::optional<std::string> file = hf_tokenizer(source.hf_dir)) {
      spec = *file;
    }
    if (spec.empty() || (!sha256.empty() && sha256 == policy_tokenizer.sha256())) {
      tokenizer_ = &policy_tokenizer;
    } else {
      try {
        own_tokenizer_.emplace(tokenizer::Tokenizer::load(spec));
      } catch (const core::Error& e) {
        throw core::bad_input(
            fmt::format("--reward-model: cannot load its tokenizer '{}' ({})", spec, e.what()),
            {.file = origin_});
      }
      if (!sha256.empty() && own_tokenizer_->sha256() != sha256) {
        throw core::bad_input(
            fmt::format("--reward-model: the tokenizer '{}' (sha256 {}) is not the one it was "
                        "trained with (sha256 {})",
                        spec, own_tokenizer_->sha256(), sha256),
            {.file = origin_});
      }
      tokenizer_ = &*own_tokenizer_;
    }
    if (tokenizer_->vocab_size() > source.config.vocab_size) {
      throw core::bad_input(
          fmt::format("--reward-model: its tokenizer {} has {} tokens, more "
                      "than its vocabulary of {}",
                      tokenizer_->name(), tokenizer_->vocab_size(), source.config.vocab_size),
          {.file = origin_});
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world_, failure);
  pad_ = tokenizer_->special(tokenizer::Special::finetune_right_pad);
  // Forward passes only: one block's activations at a time is enough (nothing goes backward).
  assembled_ =
      assemble_model(&world_, ops, source,
                     {.purpose = ModelPurpose::score,
                      .head = model::HeadKind::reward,
                      .placement = model::Placement::frozen(config_.sharded, world_.size()),
                      .recompute = true,
                      .adapter = config_.adapter});
  log.info("GRPO reward model: {}{} ({:.1f} M parameters{}, tokenizer {})", origin_,
           config_.adapter.empty() ? "" : " with the adapter " + config_.adapter,
           static_cast<double>(assembled_.model->layout().parameter_count()) / 1e6,
           config_.sharded ? ", sharded over the ranks" : "", tokenizer_->name());
}

RewardModel::~RewardModel() = default;

std::vector<double> RewardModel::score(const std::vector<RewardModelRequest>& requests) {
  const core::TraceRange range("rollout: reward model");
  model::LlamaModel& model = *assembled_.model;
  // The sequences first, on every rank, so that a record the formatter refuses stops every rank
  // before the passes (collective with sharded weights).
  std::vector<std::vector<std::int32_t>> sequences;
  std::exception_ptr failure;
  try {
    const prep::RecordFormatter formatter(*tokenizer_, prep::FormatOptions{});
    const std::int64_t positions = model.config().max_position_embeddings;
    for (const RewardModelRequest& r : requests) {
      json record = {{"response", as_valid_utf8(*r.completion)}};
      const bool messages = r.record->contains("messages");
      record["prompt"] = messages ? r.record->at("messages") : r.record->at("prompt");
      try {
        sequences.push_back(formatter.response(record).tokens);
      } catch (const core::Error& e) {
        throw core::bad_input(fmt::format("--reward-model: {}: {}", r.name, e.message()),
                              {.file = origin_});
      }
      if (static_cast<std::int64_t>(sequences.back().size()) > positions) {
        throw core::bad_input(
            fmt::format("--reward-model: {} with its completion is {} tokens, more than the "
                        "reward model's {} positions",
                        r.name, sequences.back().size(), positions),
            {.file = origin_});
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world_, failure);

  // Packed end to end into passes of at most `rows` rows' tokens (a sequence longer than a row
  // gets rows that long), each pass cut after its last sequence (BatchBuilder::finish_packed).
  std::int64_t length = config_.seq_len;
  for (const auto& s : sequences) length = std::max(length, static_cast<std::int64_t>(s.size()));
  std::vector<double> rewards;
  rewards.reserve(sequences.size());
  std::vector<data::Batch> passes;
  std::optional<data::BatchBuilder> builder;
  std::vector<std::int32_t> lasts;
  const auto close = [&] {
    if (!builder) return;
    data::Batch batch = builder->finish_packed(data::kPackedRowAlignment);
    batch.chosen_last = lasts;
    batch.rejected_last = lasts;
    batch.margins.assign(lasts.size(), 0.0F);
    passes.push_back(std::move(batch));
    builder.reset();
    lasts.clear();
  };
  for (const std::vector<std::int32_t>& s : sequences) {
    if (!builder) builder.emplace(1, config_.rows * length, pad_);
    std::int64_t last = builder->add(s, std::vector<std::uint8_t>(s.size(), 0));
    if (last < 0) {
      close();
      builder.emplace(1, config_.rows * length, pad_);
      last = builder->add(s, std::vector<std::uint8_t>(s.size(), 0));
    }
    lasts.push_back(static_cast<std::int32_t>(last));
  }
  close();
  // With sharded weights a pass gathers them: every rank runs as many as the busiest.
  auto count = static_cast<std::int64_t>(passes.size());
  if (config_.sharded)
    count = dist::all_reduce(world_.comm(), count, dist::ReduceOp::max, "reward model passes");
  for (std::int64_t p = 0; p < count; ++p) {
    if (p >= static_cast<std::int64_t>(passes.size())) {
      (void)BradleyTerryLoss(model).forward(data::Batch::none(1), 0.0);
      continue;
    }
    const RewardOutput out =
        BradleyTerryLoss(model).forward(passes[static_cast<std::size_t>(p)], 0.0);
    for (const float r : out.chosen) rewards.push_back(static_cast<double>(r));
  }
  return rewards;
}

}  // namespace l3::train::grpo
