// Where a run's model comes from: --model (a preset or config.json: random initial weights)
// and/or --init (a checkpoint: its model config and weights). Used by training, evaluation
// and the tools.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/manifest.hpp"
#include "dist/world.hpp"
#include "model/llama_model.hpp"

namespace l3::train {

struct ModelSource {
  model::ModelConfig config;
  std::optional<ckpt::Manifest> checkpoint;  // when initialised from one
  std::string step_dir;                      // its step directory
};

// `model` may be empty when `init` is a checkpoint; when both are given they must describe
// the same model. usage/bad_input Errors name the path.
[[nodiscard]] ModelSource resolve_model_source(const std::string& model, const std::string& init);

// Random initial weights from `seed`, then, with a checkpoint, its tensors: all of them, or the
// backbone only when the checkpoint has a language-model head and `model` a reward head (a
// reward model from an SFT model: the score head keeps its random initialisation). Rank 0
// reads the file and broadcasts. Collective over `world`.
void initialize_model(const dist::World& world, model::LlamaModel& model, const ModelSource& source,
                      std::uint64_t seed);

}  // namespace l3::train
