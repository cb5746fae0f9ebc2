#include "train/model_source.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/model_file.hpp"
#include "core/error.hpp"
#include "dist/agree.hpp"
#include "dist/gather_strings.hpp"
#include "model/parameter_init.hpp"

namespace l3::train {

namespace fs = std::filesystem;

namespace {

bool is_hugging_face_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || !fs::is_regular_file(dir / "config.json", ec)) return false;
  const fs::directory_iterator entries(dir, ec);
  return std::any_of(fs::begin(entries), fs::end(entries), [](const fs::directory_entry& entry) {
    return entry.path().extension() == ".safetensors";
  });
}

}  // namespace

ModelSource resolve_model_source(const std::string& model, const std::string& init) {
  ModelSource source;
  if (!init.empty()) {
    if (!ckpt::is_checkpoint(init) && is_hugging_face_dir(init)) {
      throw core::usage_error(fmt::format(
          "{}: a Hugging Face model directory; importing Hugging Face weights is not built yet "
          "in this version (--init takes a llama3-hpc checkpoint; --model {}/config.json starts "
          "from random weights)",
          init, init));
    }
    source.step_dir = ckpt::resolve_checkpoint(init);
    source.checkpoint = ckpt::read_manifest(source.step_dir);
    source.config = source.checkpoint->model;
    source.config.name = source.step_dir;
    if (!model.empty()) {
      const model::ModelConfig given = model::resolve_model(model);
      if (given.to_hf_json() != source.config.to_hf_json()) {
        throw core::usage_error(
            fmt::format("--model {} does not describe the model of the checkpoint {} (leave "
                        "--model out to use the checkpoint's)",
                        model, source.step_dir));
      }
    }
    return source;
  }
  source.config = model::resolve_model(model);
  return source;
}

void initialize_model(const dist::World& world, model::LlamaModel& model, const ModelSource& source,
                      std::uint64_t seed) {
  const model::ParameterLayout& layout = model.layout();
  std::vector<float> host(static_cast<std::size_t>(layout.total()));
  model::initialize_parameters(host, layout, seed);
  if (source.checkpoint) {
    const ckpt::Manifest& m = *source.checkpoint;
    if (m.head == model::HeadKind::reward && layout.head() == model::HeadKind::language_model) {
      throw core::bad_input(
          "a reward-model checkpoint cannot initialise a language model (its lm_head is gone)",
          {.file = source.step_dir});
    }
    const ckpt::ModelTensors which =
        m.head == layout.head() ? ckpt::ModelTensors::all : ckpt::ModelTensors::backbone_only;
    std::exception_ptr failure;
    if (world.is_root()) {
      try {
        ckpt::read_model_file((fs::path(source.step_dir) / ckpt::kModelFile).string(), layout, host,
                              which);
        ckpt::check_loaded_model(m, source.step_dir, layout, host, [&](const std::string& name) {
          return which == ckpt::ModelTensors::backbone_only &&
                 (name == "lm_head.weight" || name == "score.weight");
        });
      } catch (...) {
        failure = std::current_exception();
      }
    }
    dist::agree_on_failure(world, failure);
    dist::broadcast_bytes(world.comm(), host.data(), host.size() * sizeof(float), 0);
  }
  model.load_parameters(host);
}

}  // namespace l3::train
