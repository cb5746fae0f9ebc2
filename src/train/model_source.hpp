// Where a run's model comes from: --model (a preset or config.json: random initial weights)
// and/or --init (a checkpoint: its model config and weights). Used by training, evaluation
// and the tools.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"
#include "dist/world.hpp"
#include "model/llama_model.hpp"

namespace l3::ckpt {
class TensorFileReader;
}
namespace l3::safetensors {
class SafetensorsModel;
}

namespace l3::train {

class LoraCheckpointModel;

struct ModelSource {
  model::ModelConfig config;
  std::optional<ckpt::Manifest> checkpoint;  // when initialised from one
  std::string step_dir;                      // its step directory
  // A Hugging Face model directory (config.json + safetensors), when initialised from one, and
  // the head its architecture has (LlamaForCausalLM / LlamaForSequenceClassification).
  std::string hf_dir;
  model::HeadKind hf_head = model::HeadKind::language_model;

  // The head of the initial weights (checkpoint or Hugging Face), if any.
  [[nodiscard]] std::optional<model::HeadKind> initial_head() const {
    if (checkpoint) return checkpoint->head;
    if (!hf_dir.empty()) return hf_head;
    return std::nullopt;
  }
  // What the weights come from, for messages: the step directory or the HF directory.
  [[nodiscard]] const std::string& origin() const { return checkpoint ? step_dir : hf_dir; }
};

// `init`: a llama3-hpc checkpoint, or a Hugging Face model directory (config.json with
// architectures LlamaForCausalLM or LlamaForSequenceClassification, and model.safetensors or
// model.safetensors.index.json; tied embeddings when lm_head.weight is absent). `model` may be
// empty when `init` is given; when both are given they must describe the same model.
// usage/bad_input Errors name the path.
[[nodiscard]] ModelSource resolve_model_source(const std::string& model, const std::string& init);
// The same for a checkpoint's manifest read elsewhere (the node-local level); `origin` names it.
[[nodiscard]] ModelSource checkpoint_model_source(const std::string& model,
                                                  const ckpt::Manifest& manifest,
                                                  const std::string& origin);

// This process alone: reads the initial weights of `source` (checkpoint or Hugging Face; none
// for a random start) into `flat`, laid out by `layout`, with the checks described below.
void read_initial_weights(const ModelSource& source, const model::ParameterLayout& layout,
                          std::span<float> flat);

// Random initial weights from `seed`, then, with a checkpoint or a Hugging Face model, its
// tensors: all of them, or the backbone only when it has a language-model head and `model` a
// reward head (a reward model from an SFT model: the score head keeps its random
// initialisation). Every tensor's presence and shape is checked; checkpoint weights also
// against their checksums. Rank 0 reads the files and broadcasts. Collective over `world`.
// Returns the fp32 values loaded (for master weights kept outside the model).
[[nodiscard]] std::vector<float> initialize_model(const dist::World& world,
                                                  model::LlamaModel& model,
                                                  const ModelSource& source, std::uint64_t seed);

// The same initial weights at the layout positions `ranges` only (this rank's share, ascending),
// back to back, for a model whose weights no rank holds whole (parameter sharding): every rank
// draws the random values of its ranges and reads only its slices of the files (safetensors
// through the map, model.h5 by hyperslab); a checkpoint's checksums are checked once over all
// ranks (each checks a share of the slices). Collective over `world`; the same checks and
// errors as initialize_model.
[[nodiscard]] std::vector<float> initial_weights_of_ranges(
    const dist::World& world, const model::ParameterLayout& layout, const ModelSource& source,
    std::uint64_t seed, const std::vector<model::FlatRange>& ranges);

// This process alone, one tensor at a time: what read_initial_weights puts at a tensor's place
// after the random initialisation from `seed` (which the tensors the source lacks keep), for
// who streams a model instead of holding it (a LoRA checkpoint's base). Checkpoint tensors are
// checked against their checksums as they are read; a LoRA checkpoint gives its merged model
// (train/lora_checkpoint_model.hpp). The checks and errors of read_initial_weights.
class ModelTensorReader {
 public:
  ModelTensorReader(const ModelSource& source, const model::ParameterLayout& layout,
                    std::uint64_t seed);
  ~ModelTensorReader();
  ModelTensorReader(const ModelTensorReader&) = delete;
  ModelTensorReader& operator=(const ModelTensorReader&) = delete;

  // t: a tensor of the layout; out: its numel values.
  void read(const model::TensorInfo& t, std::span<float> out);
  // Elements [first, first + out.size()) of `t`, not checked against a checkpoint's checksums
  // (a share of a tensor has none): for a caller that checks the whole otherwise (a LoRA base's
  // digest). A LoRA checkpoint's base is not checked here either.
  void read_range(const model::TensorInfo& t, std::int64_t first, std::span<float> out);

 private:
  // `t` is not read: it keeps its random initialisation.
  [[nodiscard]] bool keeps_initialisation(const model::TensorInfo& t) const;

  ModelSource source_;
  model::ParameterLayout layout_;
  std::uint64_t seed_;
  std::unique_ptr<safetensors::SafetensorsModel> hf_;
  std::unique_ptr<ckpt::TensorFileReader> file_;
  std::unique_ptr<LoraCheckpointModel> lora_;
};

}  // namespace l3::train
