// A reward model as one of GRPO's rewards (--reward-model CKPT [--reward-adapter DIR]): a
// reward checkpoint, a Hugging Face LlamaForSequenceClassification directory, or a model with a
// PEFT reward adapter (SEQ_CLS) folded in, loaded frozen on the training's backend, whole on
// every rank or, with --shard-parameters, sharded over the ranks like the policy.
//
// A completion is scored as `llama3-hpc score --prompt P --response COMPLETION` scores a
// response (prep::RecordFormatter::response with the reward model's tokenizer: the prompt's user
// turn or messages, then the completion as the assistant's turn), the score head read at the
// sequence's last token; sequences are packed into passes of the training's micro-batch rows.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "dist/world.hpp"
#include "io/tokenizer/tokenizer.hpp"
#include "kernels/ops.hpp"
#include "model/llama_model.hpp"
#include "train/model_assembly.hpp"

namespace l3::train::grpo {

struct RewardModelConfig {
  std::string path;          // --reward-model
  std::string adapter;       // --reward-adapter; empty: none
  bool sharded = false;      // --shard-parameters: 1/N of its weights on each rank
  std::int64_t rows = 1;     // rows of a scoring pass (the training's micro-batch)
  std::int64_t seq_len = 0;  // their length (the training's --seq-len; longer sequences: more)
};

// What one completion is scored on: its prompt record's fields and the completion's text.
struct RewardModelRequest {
  const nlohmann::json* record = nullptr;  // {"prompt"} or {"messages"}
  const std::string* completion = nullptr;
  std::string name;  // for errors: "prompt 12 of DIR (sample 3)"
};

class RewardModel {
 public:
  // Collective over `world`. `policy_tokenizer`: used when the reward model's own is the same
  // file (its sha256), or when the reward model records none. bad_input Errors name the path:
  // not a reward model (and no reward adapter), a tokenizer it cannot load or that is not the
  // one it was trained with.
  RewardModel(const dist::World& world, const core::Logger& log, kernels::Ops& ops,
              const RewardModelConfig& config, const tokenizer::Tokenizer& policy_tokenizer);
  ~RewardModel();
  RewardModel(const RewardModel&) = delete;
  RewardModel& operator=(const RewardModel&) = delete;
  RewardModel(RewardModel&&) = delete;
  RewardModel& operator=(RewardModel&&) = delete;

  // The reward of each request, in order. Collective over the world: with sharded weights every
  // rank runs as many passes as the rank with the most (empty ones take part in the gathers).
  [[nodiscard]] std::vector<double> score(const std::vector<RewardModelRequest>& requests);

  [[nodiscard]] const std::string& origin() const noexcept { return origin_; }
  [[nodiscard]] const model::LlamaModel& model() const noexcept { return *assembled_.model; }

 private:
  const dist::World& world_;
  RewardModelConfig config_;
  std::string origin_;  // the checkpoint step or HF directory, for messages
  std::optional<tokenizer::Tokenizer> own_tokenizer_;
  const tokenizer::Tokenizer* tokenizer_ = nullptr;
  std::int32_t pad_ = 0;
  AssembledModel assembled_;
};

}  // namespace l3::train::grpo
