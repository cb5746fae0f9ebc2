// What `generate` and `score` run on: a model loaded from a checkpoint (--init, or its alias
// --ckpt) on the CPU backend, and the tokenizer it was trained with (--tokenizer, else the one
// the checkpoint's manifest names, checked against the manifest's sha256).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "ckpt/manifest.hpp"
#include "ckpt/peft_adapter.hpp"
#include "cli/command.hpp"
#include "dist/world.hpp"
#include "io/tokenizer/tokenizer.hpp"
#include "kernels/ops.hpp"
#include "model/llama_model.hpp"
#include "parallel/sharded_weights.hpp"
#include "train/model_assembly.hpp"

namespace l3::cli {

// --init/--ckpt, --tokenizer, --ignore-tokenizer-mismatch, --adapter.
void declare_inference_model_options(po::options_description& options);
// --adapter DIR alone (eval declares its own model options), and its value ("" when absent).
void declare_adapter_option(po::options_description& options);
[[nodiscard]] std::string adapter_option(const po::variables_map& options);

// The checkpoint path of --init or --ckpt: a usage Error when neither or both are given.
[[nodiscard]] std::string model_path_option(const po::variables_map& options);

struct InferenceModel {
  std::string step_dir;  // the resolved checkpoint step directory, or the HF directory
  ckpt::Manifest manifest;
  std::unique_ptr<kernels::Ops> ops;                 // declared before the model: outlives it
  std::unique_ptr<parallel::ShardedWeights> shards;  // sharded over ranks; else null
  std::unique_ptr<model::LlamaModel> model;
  std::string adapter;        // the LoRA adapter folded into the weights (--adapter); empty: none
  train::ModelSource source;  // where the weights come from
};

// A checkpoint step directory, a checkpoint root whose `latest` names one, or a Hugging Face
// model directory (its tokenizer.json or original/tokenizer.model is the model's tokenizer).
// The model must have the `head` wanted (bad_input Error naming the path otherwise); anything
// else is a bad_input Error naming the path. `shard_over`: hold 1/N of the weights on each rank
// of this world (parallel::ShardedWeights; collective, and so is every forward pass); null: the
// whole model on this rank alone. `adapter`: a PEFT LoRA adapter directory folded into the
// weights (ckpt::apply_peft_adapter; with shard_over each rank folds it into its share), whose
// SEQ_CLS score head lets a language model's checkpoint serve as a reward model's base; empty:
// none.
// `purpose`: what the model is for (train/model_assembly.hpp, which builds and loads it).
[[nodiscard]] InferenceModel load_inference_model(const std::string& path, model::HeadKind head,
                                                  train::ModelPurpose purpose,
                                                  const dist::World* shard_over = nullptr,
                                                  const std::string& adapter = "");

// load_inference_model in two halves: what the model is (its source, step directory and
// manifest, the head checked; nothing read but the metadata), so that its tokenizer and its
// memory can be known before the weights are read; then the weights (collective over
// shard_over when given).
[[nodiscard]] InferenceModel describe_inference_model(const std::string& path, model::HeadKind head,
                                                      const std::string& adapter = "");
// `ops`: the backend to load onto (made by kernels::make_ops); null: the CPU backend.
void load_inference_weights(InferenceModel& loaded, model::HeadKind head,
                            train::ModelPurpose purpose, const dist::World* shard_over = nullptr,
                            std::unique_ptr<kernels::Ops> ops = nullptr);

// `spec` (--tokenizer) when given, else the tokenizer named by the manifest. The tokenizer's
// sha256 must equal the manifest's (when it records one) unless ignore_mismatch, and its
// vocabulary must fit in the model's.
[[nodiscard]] tokenizer::Tokenizer load_inference_tokenizer(const std::optional<std::string>& spec,
                                                            const InferenceModel& loaded,
                                                            bool ignore_mismatch,
                                                            const core::Logger& log);

// The same from the options of declare_inference_model_options.
[[nodiscard]] tokenizer::Tokenizer load_inference_tokenizer(const po::variables_map& options,
                                                            const InferenceModel& loaded,
                                                            const core::Logger& log);

}  // namespace l3::cli
