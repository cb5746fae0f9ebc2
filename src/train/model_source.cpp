#include "train/model_source.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/model_file.hpp"
#include "ckpt/rank_state.hpp"
#include "ckpt/tensor_file.hpp"
#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "io/safetensors/safetensors_file.hpp"
#include "model/parameter_init.hpp"
#include "train/lora_checkpoint_model.hpp"

namespace l3::train {

namespace fs = std::filesystem;

namespace {

bool is_hugging_face_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || !fs::is_regular_file(dir / "config.json", ec)) return false;
  const fs::directory_iterator entries(dir, ec);
  // An index alone counts: its shards, missing or not, are then checked by name.
  return fs::exists(dir / "model.safetensors.index.json", ec) ||
         std::any_of(fs::begin(entries), fs::end(entries), [](const fs::directory_entry& entry) {
           return entry.path().extension() == ".safetensors";
         });
}

ModelSource hugging_face_source(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const nlohmann::json config =
      core::read_json_object(config_path, "a Hugging Face model config (config.json)");
  ModelSource source;
  source.hf_dir = dir;
  const nlohmann::json architectures = config.value("architectures", nlohmann::json::array());
  const auto has = [&](const char* name) {
    return architectures.is_array() &&
           std::find(architectures.begin(), architectures.end(), name) != architectures.end();
  };
  if (has("LlamaForCausalLM")) {
    source.hf_head = model::HeadKind::language_model;
  } else if (has("LlamaForSequenceClassification")) {
    source.hf_head = model::HeadKind::reward;
    if (config.value("num_labels", 1) != 1) {
      throw core::bad_input(
          "a sequence-classification model with more than one label is not "
          "a reward model (num_labels must be 1)",
          {.file = config_path});
    }
  } else {
    throw core::bad_input(fmt::format("architectures {} : only LlamaForCausalLM and "
                                      "LlamaForSequenceClassification are supported",
                                      architectures.dump()),
                          {.file = config_path});
  }
  source.config = model::from_hf_config(config, config_path);
  source.config.name = dir;
  // Checks every shard's header now, on every rank, before any work.
  const safetensors::SafetensorsModel weights(dir);
  if (source.hf_head == model::HeadKind::language_model && !source.config.tie_word_embeddings &&
      weights.find("lm_head.weight") == nullptr) {
    source.config.tie_word_embeddings = true;  // no lm_head.weight: tied, as transformers loads it
  }
  return source;
}

bool is_head_tensor(const std::string& name) {
  return name == "lm_head.weight" || name == "score.weight";
}

// Whether `t` is read from the Hugging Face model: all tensors, the head only when the file has
// the same kind of head (else a new score head keeps its initialisation).
bool read_from_file(const ModelSource& source, const model::ParameterLayout& layout,
                    const model::TensorInfo& t) {
  return !is_head_tensor(t.name) || source.hf_head == layout.head();
}

// Every tensor read from the model is present with the layout's shape (the headers only).
void check_hugging_face_tensors(const ModelSource& source, const model::ParameterLayout& layout,
                                const safetensors::SafetensorsModel& weights) {
  for (const model::TensorInfo& t : layout.tensors()) {
    if (!read_from_file(source, layout, t)) continue;
    const safetensors::SafetensorsTensor* found = weights.find(t.name);
    if (found == nullptr) {
      throw core::bad_input("the model has no such tensor (not a Llama 3 model of this shape?)",
                            {.file = source.hf_dir, .tensor = t.name});
    }
    if (found->shape != t.shape) {
      throw core::bad_input(fmt::format("shape [{}] in the file, [{}] expected from config.json",
                                        fmt::join(found->shape, ", "), fmt::join(t.shape, ", ")),
                            {.file = source.hf_dir, .tensor = t.name});
    }
  }
}

// The tensors of `layout` from a Hugging Face model into `flat`.
void read_hugging_face_weights(const ModelSource& source, const model::ParameterLayout& layout,
                               std::span<float> flat) {
  const safetensors::SafetensorsModel weights(source.hf_dir);
  check_hugging_face_tensors(source, layout, weights);
  for (const model::TensorInfo& t : layout.tensors()) {
    if (!read_from_file(source, layout, t)) continue;
    weights.read(t.name, flat.subspan(static_cast<std::size_t>(t.offset),
                                      static_cast<std::size_t>(t.numel)));
  }
}

}  // namespace

namespace {

void require_same_model(const std::string& model, const ModelSource& source) {
  if (model.empty()) return;
  const model::ModelConfig given = model::resolve_model(model);
  if (given.to_hf_json() != source.config.to_hf_json()) {
    throw core::usage_error(
        fmt::format("--model {} does not describe the model of {} (leave --model out to use "
                    "its own)",
                    model, source.origin()));
  }
}

}  // namespace

ModelSource checkpoint_model_source(const std::string& model, const ckpt::Manifest& manifest,
                                    const std::string& origin) {
  ModelSource source;
  source.step_dir = origin;
  source.checkpoint = manifest;
  source.config = manifest.model;
  source.config.name = origin;
  require_same_model(model, source);
  return source;
}

ModelSource resolve_model_source(const std::string& model, const std::string& init) {
  ModelSource source;
  if (!init.empty()) {
    if (!ckpt::is_checkpoint(init) && is_hugging_face_dir(init)) {
      source = hugging_face_source(init);
      require_same_model(model, source);
      return source;
    }
    const std::string step_dir = ckpt::resolve_checkpoint(init);
    return checkpoint_model_source(model, ckpt::read_manifest(step_dir), step_dir);
  }
  source.config = model::resolve_model(model);
  return source;
}

namespace {

void require_head_fits(const ModelSource& source, const model::ParameterLayout& layout) {
  if (source.initial_head() == model::HeadKind::reward &&
      layout.head() == model::HeadKind::language_model) {
    throw core::bad_input("a reward model cannot initialise a language model (it has no lm_head)",
                          {.file = source.origin()});
  }
}

bool is_lora_checkpoint(const ModelSource& source) {
  return source.checkpoint && source.checkpoint->lora;
}

}  // namespace

void read_initial_weights(const ModelSource& source, const model::ParameterLayout& layout,
                          std::span<float> flat) {
  const std::optional<model::HeadKind> head = source.initial_head();
  if (!head) return;
  require_head_fits(source, layout);
  if (is_lora_checkpoint(source)) {
    LoraCheckpointModel(source).read_all(layout, flat);
    return;
  }
  if (!source.hf_dir.empty()) {
    read_hugging_face_weights(source, layout, flat);
    return;
  }
  const ckpt::ModelTensors which =
      *head == layout.head() ? ckpt::ModelTensors::all : ckpt::ModelTensors::backbone_only;
  ckpt::read_model_file((fs::path(source.step_dir) / ckpt::kModelFile).string(), layout, flat,
                        which);
  ckpt::check_loaded_model(
      *source.checkpoint, source.step_dir, layout, flat, [&](const std::string& name) {
        return which == ckpt::ModelTensors::backbone_only && is_head_tensor(name);
      });
}

std::vector<float> initialize_model(const dist::World& world, model::LlamaModel& model,
                                    const ModelSource& source, std::uint64_t seed) {
  const model::ParameterLayout& layout = model.layout();
  std::vector<float> host(static_cast<std::size_t>(layout.total()));
  model::initialize_parameters(host, layout, seed);
  if (source.initial_head()) {
    std::exception_ptr failure;
    if (world.is_root()) {
      try {
        read_initial_weights(source, layout, host);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    dist::agree_on_failure(world, failure);
    dist::broadcast_bytes(world.comm(), host.data(), host.size() * sizeof(float), 0);
  }
  model.load_parameters(host);
  return host;
}

namespace {

// initial_weights_of_ranges of a LoRA checkpoint: each rank reads its shares of the base and
// folds the adapters into them; the base is checked by the ranks together (its digest).
// `values`: the ranges' random initialisation, replaced where the checkpoint's model has weights.
void read_lora_checkpoint_ranges(const dist::World& world, const model::ParameterLayout& layout,
                                 const ModelSource& source,
                                 const std::vector<model::FlatRange>& ranges,
                                 std::span<float> values) {
  std::unique_ptr<LoraCheckpointModel> merged;
  std::exception_ptr failure;
  try {
    require_head_fits(source, layout);
    merged = std::make_unique<LoraCheckpointModel>(source);
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
  merged->check_base(world);
  try {
    const model::ParameterLayout& from = merged->layout();
    for (const ckpt::TensorSlice& slice : ckpt::tensor_slices(layout, ranges)) {
      const model::TensorInfo& t = layout.tensors()[slice.tensor];
      const model::TensorInfo* in = from.lookup(t.name);
      // A head of another kind (a reward model's new score head) keeps its initialisation.
      if (in == nullptr || (is_head_tensor(t.name) && from.head() != layout.head())) continue;
      merged->read_range(*in, slice.first,
                         values.subspan(static_cast<std::size_t>(slice.position),
                                        static_cast<std::size_t>(slice.count)));
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
}

}  // namespace

std::vector<float> initial_weights_of_ranges(const dist::World& world,
                                             const model::ParameterLayout& layout,
                                             const ModelSource& source, std::uint64_t seed,
                                             const std::vector<model::FlatRange>& ranges) {
  std::int64_t total = 0;
  for (const model::FlatRange& r : ranges) total += r.size();
  std::vector<float> values(static_cast<std::size_t>(total));
  model::initialize_parameter_ranges(values, layout, seed, ranges);
  if (is_lora_checkpoint(source)) {
    read_lora_checkpoint_ranges(world, layout, source, ranges, values);
    return values;
  }
  const std::optional<model::HeadKind> head = source.initial_head();
  if (!head) return values;
  std::exception_ptr failure;
  try {
    require_head_fits(source, layout);
    if (!source.hf_dir.empty()) {
      // Every rank checks the tensors' presence and shapes (the headers only), then reads its
      // slices.
      const safetensors::SafetensorsModel weights(source.hf_dir);
      check_hugging_face_tensors(source, layout, weights);
      for (const ckpt::TensorSlice& slice : ckpt::tensor_slices(layout, ranges)) {
        const model::TensorInfo& t = layout.tensors()[slice.tensor];
        if (!read_from_file(source, layout, t)) continue;
        weights.read_range(t.name, slice.first,
                           std::span(values).subspan(static_cast<std::size_t>(slice.position),
                                                     static_cast<std::size_t>(slice.count)));
      }
    } else {
      const ckpt::ModelTensors which =
          *head == layout.head() ? ckpt::ModelTensors::all : ckpt::ModelTensors::backbone_only;
      const auto skip = [&](const std::string& name) {
        return which == ckpt::ModelTensors::backbone_only && is_head_tensor(name);
      };
      // Every byte checked once, by the ranks in turn, then each reads its share.
      ckpt::check_model_share(*source.checkpoint, source.step_dir, layout, skip, world.rank(),
                              world.size());
      ckpt::read_model_ranges((fs::path(source.step_dir) / ckpt::kModelFile).string(), layout,
                              ranges, values, which);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
  return values;
}

ModelTensorReader::ModelTensorReader(const ModelSource& source,
                                     const model::ParameterLayout& layout, std::uint64_t seed)
    : source_(source), layout_(layout), seed_(seed) {
  if (!source_.initial_head()) return;
  require_head_fits(source_, layout_);
  if (!source_.hf_dir.empty()) {
    hf_ = std::make_unique<safetensors::SafetensorsModel>(source_.hf_dir);
    check_hugging_face_tensors(source_, layout_, *hf_);
  } else if (is_lora_checkpoint(source_)) {
    lora_ = std::make_unique<LoraCheckpointModel>(source_);
  } else {
    file_ = std::make_unique<ckpt::TensorFileReader>(
        (fs::path(source_.step_dir) / ckpt::kModelFile).string());
    ckpt::require_model_format(*file_);
  }
}

ModelTensorReader::~ModelTensorReader() = default;

bool ModelTensorReader::keeps_initialisation(const model::TensorInfo& t) const {
  const std::optional<model::HeadKind> head = source_.initial_head();
  // No weights to read, or a head of another kind than the source's (a reward model's new score
  // head): the random initialisation, as in read_initial_weights.
  return !head || (is_head_tensor(t.name) && *head != layout_.head());
}

void ModelTensorReader::read(const model::TensorInfo& t, std::span<float> out) {
  read_range(t, 0, out);
  // A whole tensor of a checkpoint has its checksums: checked as it is read.
  if (file_ && !keeps_initialisation(t))
    ckpt::check_loaded_tensor(*source_.checkpoint, source_.step_dir, t, out);
}

void ModelTensorReader::read_range(const model::TensorInfo& t, std::int64_t first,
                                   std::span<float> out) {
  if (keeps_initialisation(t)) {
    const std::int64_t begin = t.offset + first;
    model::initialize_parameter_ranges(out, layout_, seed_,
                                       {{begin, begin + static_cast<std::int64_t>(out.size())}});
  } else if (hf_) {
    hf_->read_range(t.name, first, out);
  } else if (lora_) {
    // The nested base's digest is not checked: the caller's digest covers what this gives.
    lora_->read_range(lora_->layout().find(t.name), first, out);
  } else {
    file_->read(t.name, t.shape, first, out);
  }
}

}  // namespace l3::train
