#include "train/lora_checkpoint_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/checksum.hpp"
#include "ckpt/model_file.hpp"
#include "core/error.hpp"
#include "train/model_source.hpp"

namespace l3::train {

namespace fs = std::filesystem;

namespace {

// xxHash64 of a flat buffer fed tensor by tensor in layout order: the zero padding between
// tensors is fed too, so the digest is the one of the whole buffer (what training recorded).
class FlatDigest {
 public:
  void add(std::int64_t offset, std::span<const float> values) {
    pad_to(offset);
    stream_.update(std::as_bytes(values));
    position_ = offset + static_cast<std::int64_t>(values.size());
  }
  [[nodiscard]] std::uint64_t finish(std::int64_t total) {
    pad_to(total);
    return stream_.digest();
  }

 private:
  void pad_to(std::int64_t offset) {
    static constexpr std::array<float, model::ParameterLayout::kAlignment> kZeros{};
    while (position_ < offset) {
      const std::int64_t n =
          std::min<std::int64_t>(offset - position_, static_cast<std::int64_t>(kZeros.size()));
      stream_.update(std::as_bytes(std::span(kZeros).first(static_cast<std::size_t>(n))));
      position_ += n;
    }
  }

  ckpt::Xxh64Stream stream_;
  std::int64_t position_ = 0;
};

std::uint64_t run_seed(const ckpt::Manifest& m, const std::string& step_dir) {
  const auto seed = m.config.find("seed");
  if (seed == m.config.end() || !seed->is_number_unsigned()) {
    throw core::bad_input(
        "malformed manifest: a LoRA checkpoint's \"config\" has no \"seed\" (the seed of its "
        "base's new tensors)",
        {.file = (fs::path(step_dir) / "manifest.json").string()});
  }
  return seed->get<std::uint64_t>();
}

}  // namespace

std::vector<float> read_checkpoint_adapters(const ckpt::Manifest& manifest,
                                            const std::string& step_dir) {
  if (!manifest.lora)
    throw core::internal_error("read_checkpoint_adapters: not a LoRA checkpoint");
  const model::ParameterLayout layout = manifest.layout();
  std::vector<float> values(static_cast<std::size_t>(layout.total()), 0.0F);
  ckpt::read_model_file((fs::path(step_dir) / ckpt::kModelFile).string(), layout, values);
  ckpt::check_loaded_model(manifest, step_dir, layout, values,
                           [](const std::string& /*name*/) { return false; });
  return values;
}

LoraCheckpointModel::LoraCheckpointModel(const ModelSource& checkpoint)
    : manifest_(checkpoint.checkpoint.value()),
      step_dir_(checkpoint.step_dir),
      layout_(manifest_.model, manifest_.head),
      adapter_layout_(manifest_.layout()),
      adapters_(read_checkpoint_adapters(manifest_, step_dir_)) {
  for (const model::AdaptedWeight& w : model::adapted_weights(layout_, adapter_layout_))
    adapted_.emplace(w.weight, w);
  if (manifest_.base.empty()) {
    throw core::bad_input("malformed manifest: a LoRA checkpoint that names no base model",
                          {.file = step_dir_});
  }
  ModelSource base;
  try {
    base = resolve_model_source("", manifest_.base);
  } catch (const core::Error& e) {
    throw core::bad_input(
        fmt::format("the base model these adapters were trained on cannot be read: {}", e.what()),
        {.file = step_dir_});
  }
  if (base.config.to_hf_json() != manifest_.model.to_hf_json()) {
    throw core::bad_input(
        fmt::format("the model at {} is not the base these adapters were trained on (another "
                    "configuration)",
                    manifest_.base),
        {.file = step_dir_});
  }
  base_ = std::make_unique<ModelTensorReader>(base, layout_, run_seed(manifest_, step_dir_));
}

LoraCheckpointModel::~LoraCheckpointModel() = default;

void LoraCheckpointModel::check_base_digest(std::uint64_t digest) const {
  const std::string hex = ckpt::to_hex(digest);
  if (hex != manifest_.base_xxh64) {
    throw core::bad_input(
        fmt::format("the model at {} is not the one these adapters were trained on (its "
                    "weights' xxHash64 is {}, the checkpoint's base had {})",
                    manifest_.base, hex, manifest_.base_xxh64),
        {.file = step_dir_});
  }
}

void LoraCheckpointModel::add_adapters(const model::TensorInfo& t, std::span<float> out) const {
  if (layout_.head() == model::HeadKind::reward && t.offset == layout_.score()) {
    const std::span<const float> score = std::span(adapters_).subspan(
        static_cast<std::size_t>(adapter_layout_.score()), out.size());
    std::copy(score.begin(), score.end(), out.begin());
    return;
  }
  if (const auto found = adapted_.find(t.offset); found != adapted_.end()) {
    const model::LoraConfig& lora = adapter_layout_.lora();
    model::add_adapter_product(out, found->second, adapters_, lora.rank, lora.scale());
  }
}

void LoraCheckpointModel::read(const model::TensorInfo& t, std::span<float> out) {
  if (!base_checked_) {
    FlatDigest digest;
    std::vector<float> values;
    for (const model::TensorInfo& each : layout_.tensors()) {
      values.resize(static_cast<std::size_t>(each.numel));
      base_->read(each, values);
      digest.add(each.offset, values);
    }
    check_base_digest(digest.finish(layout_.total()));
    base_checked_ = true;
  }
  base_->read(t, out);
  add_adapters(t, out);
}

void LoraCheckpointModel::read_all(const model::ParameterLayout& target, std::span<float> flat) {
  FlatDigest digest;
  std::vector<float> scratch;  // a tensor the target has no place for (a replaced lm_head)
  for (const model::TensorInfo& t : layout_.tensors()) {
    const model::TensorInfo* into = target.lookup(t.name);
    std::span<float> out;
    if (into != nullptr) {
      out = flat.subspan(static_cast<std::size_t>(into->offset), static_cast<std::size_t>(t.numel));
    } else {
      scratch.resize(static_cast<std::size_t>(t.numel));
      out = scratch;
    }
    base_->read(t, out);
    digest.add(t.offset, out);
    add_adapters(t, out);
  }
  check_base_digest(digest.finish(layout_.total()));
  base_checked_ = true;
}

}  // namespace l3::train
