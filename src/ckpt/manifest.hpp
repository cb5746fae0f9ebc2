// manifest.json of a checkpoint step directory: what the checkpoint is (step, phase, model),
// where training continues (data position), and the run's resolved configuration. It is
// written last, so a step directory with a readable manifest is complete (docs/FORMAT.md).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/phase.hpp"
#include "model/model_config.hpp"
#include "model/parameter_layout.hpp"

namespace l3::ckpt {

inline constexpr std::string_view kCheckpointFormat = "llama3-hpc/checkpoint";
inline constexpr std::int64_t kCheckpointVersion = 1;

struct Manifest {
  std::int64_t step = 0;  // optimizer steps completed
  Phase phase = Phase::sft;
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
  nlohmann::json libraries = nlohmann::json::object();  // name -> version
  std::string created_utc;                              // ISO 8601

  // Restart state.
  std::int64_t adamw_step = 0;     // AdamW updates taken (skipped steps take none)
  std::int64_t skipped_steps = 0;  // non-finite steps skipped so far
  std::int64_t trained_tokens = 0;
  double trained_seconds = 0;
  nlohmann::json schedule = nlohmann::json::object();  // the LR schedule and the next step's LR
  nlohmann::json rng = nlohmann::json::object();       // generator and seed (counter-based)
  nlohmann::json metrics = nlohmann::json::object();   // last step and evaluation reported
  // The tensor table: [{"name", "shape", "slices": [[first, count, model, exp_avg,
  // exp_avg_sq], ...]}] with xxHash64 hex checksums of each slice in model.h5 and optim.h5.
  // Empty for a checkpoint that has no optimizer state (model.h5 only: it can initialise a
  // run but not resume one).
  nlohmann::json tensors = nlohmann::json::array();
  nlohmann::json files = nlohmann::json::object();  // file name -> {"bytes": N}
  // A LoRA run's checkpoint (its tensors are the adapter layout's: model/parameter_layout.hpp):
  // the adapters' settings, and the frozen model they adapt, which the checkpoint does not hold.
  std::optional<model::LoraConfig> lora;
  std::string base;  // the frozen model: the --init it was read from (resolved path)
  // Its digest as loaded (train::base_digest: the xxHash64 of its tensors' xxHash64s), checked
  // wherever the base is read again.
  std::string base_xxh64;
  // DPO: the reference model ({"kind": "base model without adapters"} for LoRA; full
  // fine-tuning: {"kind": "precomputed", "model", "model_xxh64", "file", ...}); empty otherwise.
  nlohmann::json reference = nlohmann::json::object();
  // The run's key (train/run_identity.hpp): which run the state belongs to; "" in checkpoints
  // of earlier versions.
  std::string run_key;
  // This run's own identity (train/run_identity.hpp, new_run_id): made when the run starts
  // fresh, carried over by every resume, so that the files it appends to (TensorBoard's) are
  // told from another run's with the same key; "" in checkpoints of earlier versions.
  std::string run_id;

  [[nodiscard]] bool resumable() const noexcept { return !tensors.empty(); }
  // What the tensor table and the files hold: the model's layout, or a LoRA run's adapters.
  [[nodiscard]] model::ParameterLayout layout() const;

  [[nodiscard]] nlohmann::json to_json() const;
  // bad_input Errors name `origin` (the manifest's path) and the field.
  [[nodiscard]] static Manifest from_json(const nlohmann::json& json, const std::string& origin);
};

// What a training run knows of itself at a checkpoint, as plain data.
struct RunFacts {
  std::int64_t step = 0;
  Phase phase = Phase::sft;
  model::HeadKind head = model::HeadKind::language_model;
  model::ModelConfig model;
  int world_size = 1;
  std::int64_t data_epoch = 0;
  std::int64_t data_step = 0;
  bool finished = false;
  std::string tokenizer_sha256;
  std::string tokenizer;
  nlohmann::json config = nlohmann::json::object();
  std::int64_t adamw_step = 0;
  std::int64_t skipped_steps = 0;
  std::int64_t trained_tokens = 0;
  double trained_seconds = 0;
  // Linear warmup and cosine decay from lr to min_lr over total_steps; next_lr is the rate of
  // the step after this checkpoint.
  struct Schedule {
    double lr = 0;
    double min_lr = 0;
    std::int64_t warmup = 0;
    std::int64_t total_steps = 0;
    double next_lr = 0;
  } schedule;
  std::uint64_t seed = 0;
  nlohmann::json metrics = nlohmann::json::object();  // {"last_step": ..., "last_eval": ...}
  std::optional<model::LoraConfig> lora;  // LoRA runs: the adapters and their frozen base
  std::string base;
  std::string base_xxh64;
  nlohmann::json reference = nlohmann::json::object();  // DPO (Manifest::reference)
  std::string run_key;                                  // Manifest::run_key
  std::string run_id;                                   // Manifest::run_id
};

// The manifest of a checkpoint of that run: the facts, plus what the program knows (its
// version, commit and libraries, the time) and the schedule and random streams in the
// manifest's words. The tensor and file tables are the writer's.
[[nodiscard]] Manifest describe_checkpoint(const RunFacts& run);

// Reads STEP_DIR/manifest.json.
[[nodiscard]] Manifest read_manifest(const std::string& step_dir);

[[nodiscard]] std::string_view head_name(model::HeadKind head) noexcept;

}  // namespace l3::ckpt
