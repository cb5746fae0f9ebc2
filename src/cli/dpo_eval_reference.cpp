#include "cli/dpo_eval_reference.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "parallel/sharded_weights.hpp"
#include "train/lora_checkpoint_model.hpp"
#include "train/model_source.hpp"
#include "train/train_config.hpp"

namespace l3::cli {

namespace fs = std::filesystem;

namespace {

model::DpoSettings trained_settings(const ckpt::Manifest& checkpoint) {
  const nlohmann::json& options = checkpoint.config;
  model::DpoSettings s;
  s.beta = options.value("beta", s.beta);
  s.label_smoothing = options.value("label_smoothing", 0.0);
  s.loss = train::parse_preference_loss(options.value("loss", "sigmoid"));
  return s;
}

// The stored tables that may hold this data's values: the run's own, then --reference-dir's.
std::vector<std::string> stored_tables(const ckpt::Manifest& checkpoint,
                                       const std::string& reference_dir,
                                       const std::string& data_xxh64) {
  std::vector<std::string> files;
  if (const auto recorded = checkpoint.reference.find("files");
      recorded != checkpoint.reference.end() && recorded->is_object()) {
    for (const auto& [name, path] : recorded->items()) {
      if (path.is_string()) files.push_back(path.get<std::string>());
    }
  }
  if (!reference_dir.empty())
    files.push_back((fs::path(reference_dir) / fmt::format("eval-{}.h5", data_xxh64)).string());
  return files;
}

}  // namespace

DpoEvalReference dpo_eval_reference(const CommandContext& context, const ckpt::Manifest& checkpoint,
                                    const std::string& step_dir, model::LlamaModel& model,
                                    kernels::Ops& ops, const data::DatasetIndex& index,
                                    const train::EvalConfig& config, bool sharded,
                                    const std::string& reference_dir) {
  const dist::World& world = context.world;
  DpoEvalReference out;
  out.settings = trained_settings(checkpoint);
  const std::string model_path = checkpoint.reference.value("model", "");
  const std::string model_digest = checkpoint.reference.value("model_xxh64", "");
  if (model_digest.empty()) {
    throw core::bad_input("the DPO checkpoint records no reference model (\"reference\")",
                          {.file = step_dir});
  }
  const train::ReferenceKey key{.data_xxh64 = train::data_digest(world, index),
                                .model_xxh64 = model_digest,
                                .mean = out.settings.loss == kernels::PreferenceLoss::ipo};
  if (!reference_dir.empty())
    train::check_reference_directory(world, reference_dir, "--reference-dir");

  // 1. A table already computed for this data and this reference.
  const std::vector<std::string> tables = stored_tables(checkpoint, reference_dir, key.data_xxh64);
  for (const std::string& table : tables) {
    std::string why;
    if (std::optional<train::ReferenceTable> t =
            train::read_reference(world, table, key, index.samples(), why)) {
      out.table = std::move(*t);
      out.origin = fmt::format("read from {}", table);
      return out;
    }
  }

  // 2. Computed with the reference model, which must still be there.
  std::optional<train::ModelSource> source;
  try {
    source = train::resolve_model_source("", model_path);
  } catch (const core::Error& e) {
    throw core::bad_input(
        fmt::format("the reference model {} was trained against, {}, cannot be read ({}), and no "
                    "table of its log-probabilities stored by the run{} was computed for this "
                    "data: evaluate on the run's own --data or --val-data, restore the model, "
                    "or evaluate the DPO policy on SFT data (loss and perplexity)",
                    step_dir, model_path.empty() ? "(none recorded)" : model_path, e.message(),
                    tables.empty() ? "" : fmt::format(" ({})", fmt::join(tables, ", "))),
        {.file = step_dir});
  }
  const auto check_digest = [&](const std::string& digest) {
    if (digest != model_digest) {
      throw core::bad_input(
          fmt::format("is not the reference model {} was trained against (its digest differs)",
                      step_dir),
          {.file = model_path});
    }
  };
  const data::LoaderConfig loader = train::evaluation_loader(world, model, index, config);
  if (sharded) {
    check_digest(train::base_digest(world, *source, model.layout(), 0));
    parallel::ShardedWeights reference(world, ops, model.layout(), *source, 0);
    model.set_parameter_window(&reference.window());
    out.table = train::compute_reference(world, model, index, loader, key);
    model.set_parameter_window(nullptr);
  } else {
    check_digest(
        train::base_digest(model.layout(), train::initialize_model(world, model, *source, 0)));
    out.table = train::compute_reference(world, model, index, loader, key);
  }
  out.origin = fmt::format("the log-probabilities of {} pairs computed with {}", index.samples(),
                           model_path);
  if (!reference_dir.empty()) {
    const std::string file = tables.back();
    train::write_reference(world, file, out.table);
    out.origin += fmt::format("; stored in {}", file);
  }
  return out;
}

}  // namespace l3::cli
