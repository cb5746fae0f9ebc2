#include "train/lora_checkpoint_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/checksum.hpp"
#include "ckpt/model_file.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "train/model_source.hpp"

namespace l3::train {

namespace fs = std::filesystem;

namespace {

// The digests of a base's tensors, in layout order, and the digest of those.
class TensorDigests {
 public:
  void add(std::span<const float> tensor) {
    digests_.push_back(ckpt::xxh64(std::as_bytes(tensor)));
  }
  [[nodiscard]] std::string hex() const { return digest_of(digests_); }
  static std::string digest_of(const std::vector<std::uint64_t>& digests) {
    return ckpt::to_hex(ckpt::xxh64(std::as_bytes(std::span<const std::uint64_t>(digests))));
  }

 private:
  std::vector<std::uint64_t> digests_;
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

std::string base_digest(const model::ParameterLayout& layout, std::span<const float> flat) {
  TensorDigests digests;
  for (const model::TensorInfo& t : layout.tensors()) {
    digests.add(
        flat.subspan(static_cast<std::size_t>(t.offset), static_cast<std::size_t>(t.numel)));
  }
  return digests.hex();
}

std::string base_digest(const dist::World& world, const ModelSource& source,
                        const model::ParameterLayout& layout, std::uint64_t seed) {
  const std::vector<model::TensorInfo>& tensors = layout.tensors();
  std::vector<std::uint64_t> digests(tensors.size(), 0);
  std::exception_ptr failure;
  try {
    ModelTensorReader reader(source, layout, seed);
    std::vector<float> values;
    for (std::size_t i = static_cast<std::size_t>(world.rank()); i < tensors.size();
         i += static_cast<std::size_t>(world.size())) {
      values.resize(static_cast<std::size_t>(tensors[i].numel));
      reader.read(tensors[i], values);
      digests[i] = ckpt::xxh64(std::as_bytes(std::span<const float>(values)));
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
  // Each tensor's digest is set on one rank and 0 on the others.
  dist::all_reduce(world.comm(), std::span(digests), dist::ReduceOp::bitwise_or,
                   "base model digests");
  return TensorDigests::digest_of(digests);
}

std::vector<float> read_checkpoint_adapters(const ckpt::Manifest& manifest,
                                            const std::string& step_dir) {
  if (!manifest.lora) throw core::internal_error("read_checkpoint_adapters: not a LoRA checkpoint");
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
      seed_(run_seed(manifest_, step_dir_)),
      layout_(manifest_.model, manifest_.head),
      fold_(layout_, manifest_.layout(), read_checkpoint_adapters(manifest_, step_dir_)) {
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
  base_source_ = std::make_unique<ModelSource>(std::move(base));
  base_ = std::make_unique<ModelTensorReader>(*base_source_, layout_, seed_);
}

LoraCheckpointModel::~LoraCheckpointModel() = default;

void LoraCheckpointModel::check_base_digest(const std::string& digest) const {
  if (digest != manifest_.base_xxh64) {
    throw core::bad_input(
        fmt::format("the model at {} is not the one these adapters were trained on (its "
                    "weights' digest is {}, the checkpoint's base had {})",
                    manifest_.base, digest,
                    manifest_.base_xxh64.empty()
                        ? "none this version reads (written by an earlier llama3-hpc)"
                        : manifest_.base_xxh64),
        {.file = step_dir_});
  }
}

void LoraCheckpointModel::check_base(const dist::World& world) {
  check_base_digest(base_digest(world, *base_source_, layout_, seed_));
  base_checked_ = true;
}

void LoraCheckpointModel::read(const model::TensorInfo& t, std::span<float> out) {
  if (!base_checked_) {
    TensorDigests digests;
    std::vector<float> values;
    for (const model::TensorInfo& each : layout_.tensors()) {
      values.resize(static_cast<std::size_t>(each.numel));
      base_->read(each, values);
      digests.add(values);
    }
    check_base_digest(digests.hex());
    base_checked_ = true;
  }
  base_->read(t, out);
  fold_.apply(t, 0, out);
}

void LoraCheckpointModel::read_range(const model::TensorInfo& t, std::int64_t first,
                                     std::span<float> out) {
  base_->read_range(t, first, out);
  fold_.apply(t, first, out);
}

void LoraCheckpointModel::read_all(const model::ParameterLayout& target, std::span<float> flat) {
  TensorDigests digests;
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
    digests.add(out);
    fold_.apply(t, 0, out);
  }
  check_base_digest(digests.hex());
  base_checked_ = true;
}

}  // namespace l3::train
