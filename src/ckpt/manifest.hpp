// manifest.json of a checkpoint step directory: what the checkpoint is (step, phase, model),
// where training continues (data position), and the run's resolved configuration. It is
// written last, so a step directory with a readable manifest is complete (docs/FORMAT.md).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "model/model_config.hpp"
#include "model/parameter_layout.hpp"

namespace l3::ckpt {

inline constexpr std::string_view kCheckpointFormat = "llama3-hpc/checkpoint";
inline constexpr std::int64_t kCheckpointVersion = 1;

struct Manifest {
  std::int64_t step = 0;  // optimizer steps completed
  std::string phase;      // "sft" or "reward"
  model::HeadKind head = model::HeadKind::language_model;
  model::ModelConfig model;
  int world_size = 1;
  std::int64_t data_epoch = 0;  // where the data order continues
  std::int64_t data_step = 0;
  bool finished = false;         // written after the run's last step
  std::string tokenizer_sha256;  // of the data it was trained on; empty when unknown
  std::string tokenizer;         // "bytes" or the path prep loaded it from; empty when unknown
  nlohmann::json config = nlohmann::json::object();  // the run's resolved options
  std::string program_version;
  std::string git_commit;
  std::string created_utc;  // ISO 8601

  [[nodiscard]] nlohmann::json to_json() const;
  // bad_input Errors name `origin` (the manifest's path) and the field.
  [[nodiscard]] static Manifest from_json(const nlohmann::json& json, const std::string& origin);
};

// Reads STEP_DIR/manifest.json.
[[nodiscard]] Manifest read_manifest(const std::string& step_dir);

[[nodiscard]] std::string_view head_name(model::HeadKind head) noexcept;

}  // namespace l3::ckpt
