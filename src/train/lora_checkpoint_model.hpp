// A LoRA run's checkpoint read as the model it trained: the frozen base it recorded (a Hugging
// Face directory or a checkpoint, itself possibly a LoRA one) with the adapters folded into the
// weights, W += scale * B A, and a reward run's score head its trained one (model/lora_merge).
// What `eval`, `generate`, `score`, `--init` and `export --merge` read from such a checkpoint.
// The base is checked to be the one the adapters were trained on: its digest as the run loaded
// it (base_digest below, ckpt::Manifest::base_xxh64).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"
#include "dist/world.hpp"
#include "model/lora_merge.hpp"
#include "model/parameter_layout.hpp"

namespace l3::train {

struct ModelSource;
class ModelTensorReader;

// The identity of a LoRA run's frozen base: the xxHash64 of the xxHash64s of its tensors' fp32
// values as loaded, in layout order (hex). Per tensor, so that ranks that each hold a share of
// the base compute it together. The base of `layout` laid out in `flat`:
[[nodiscard]] std::string base_digest(const model::ParameterLayout& layout,
                                      std::span<const float> flat);
// The same of a base no rank holds whole: tensor i is read and digested by rank i mod N, one
// tensor at a time (ModelTensorReader). Collective over `world`; the same value on every rank.
[[nodiscard]] std::string base_digest(const dist::World& world, const ModelSource& source,
                                      const model::ParameterLayout& layout, std::uint64_t seed);

// The adapters (and a reward run's score head) of a LoRA checkpoint, laid out by
// manifest.layout(), checked against the checkpoint's checksums. bad_input Errors name the file
// and tensor. Needs no base: what `export --adapter` writes.
[[nodiscard]] std::vector<float> read_checkpoint_adapters(const ckpt::Manifest& manifest,
                                                          const std::string& step_dir);

class LoraCheckpointModel {
 public:
  // `checkpoint`: a source whose checkpoint is a LoRA run's. Reads and checks the adapters and
  // opens the base (a bad_input Error naming the checkpoint when it is gone or another model).
  explicit LoraCheckpointModel(const ModelSource& checkpoint);
  ~LoraCheckpointModel();
  LoraCheckpointModel(const LoraCheckpointModel&) = delete;
  LoraCheckpointModel& operator=(const LoraCheckpointModel&) = delete;

  // The merged model's layout (the run's head) and the adapters' (manifest.layout()).
  [[nodiscard]] const model::ParameterLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const model::ParameterLayout& adapter_layout() const noexcept {
    return fold_.adapter_layout();
  }
  [[nodiscard]] std::span<const float> adapters() const noexcept { return fold_.adapters(); }
  [[nodiscard]] const ckpt::Manifest& manifest() const noexcept { return manifest_; }

  // The merged values of `t` (a tensor of layout()) into `out` (its numel values). The first
  // call reads the whole base once to check it (a model streamed tensor by tensor is checked
  // before any of it is used).
  void read(const model::TensorInfo& t, std::span<float> out);
  // Elements [first, first + out.size()) of `t` merged, the base not checked here (the caller
  // checks it: check_base). What a rank reads of its share.
  void read_range(const model::TensorInfo& t, std::int64_t first, std::span<float> out);

  // The base checked against the checkpoint by the ranks of `world` together (base_digest).
  // Collective; a bad_input Error on every rank when it is another model.
  void check_base(const dist::World& world);

  // The merged model into `flat`, laid out by `target`: layout() itself, or a reward model's
  // layout when the checkpoint is a language model's (the backbone is read, the score head
  // left as it is). The base is read once and checked on the way.
  void read_all(const model::ParameterLayout& target, std::span<float> flat);

 private:
  void check_base_digest(const std::string& digest) const;

  ckpt::Manifest manifest_;
  std::string step_dir_;
  std::uint64_t
      seed_;  // the run's: its base's new tensors (a reward run's score head) drawn from it
  model::ParameterLayout layout_;
  model::AdapterFold fold_;
  std::unique_ptr<ModelSource> base_source_;
  std::unique_ptr<ModelTensorReader> base_;
  bool base_checked_ = false;
};

}  // namespace l3::train
