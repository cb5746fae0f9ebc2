#include "train/model_assembly.hpp"

#include <exception>

#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "model/parameter_init.hpp"
#include "parallel/data_parallel.hpp"

namespace l3::train {

AssembledModel build_model(kernels::Ops& ops, const model::ModelConfig& config,
                           const ModelRecipe& recipe) {
  if ((recipe.purpose == ModelPurpose::train) == recipe.placement.forward_only) {
    throw core::internal_error("build_model: a training model needs a training placement");
  }
  AssembledModel assembled;
  model::ModelOptions options =
      model::ModelOptions::of(recipe.placement, recipe.recompute, recipe.lora);
  options.tensor = recipe.tensor;
  assembled.model = std::make_unique<model::LlamaModel>(config, recipe.head, ops, options);
  return assembled;
}

std::vector<float> load_frozen_weights(const dist::World* world, kernels::Ops& ops,
                                       const ModelSource& source, const ModelRecipe& recipe,
                                       AssembledModel& assembled) {
  model::LlamaModel& model = *assembled.model;
  if (recipe.placement.shards_frozen_weights()) {
    if (world == nullptr)
      throw core::internal_error("sharded weights need the ranks to shard over");
    // Each rank folds the adapter, if any, into its share of the weights.
    const std::optional<ckpt::PeftAdapter> peft =
        load_adapter_on_every_rank(*world, recipe.adapter, model.layout());
    assembled.frozen = std::make_unique<parallel::ShardedWeights>(
        *world, ops, model.layout(), source, recipe.seed, peft ? &peft->fold : nullptr);
    model.set_parameter_window(&assembled.frozen->window());
    return {};
  }
  std::vector<float> weights;
  if (world != nullptr) {
    weights = initialize_model(*world, model, source, recipe.seed);
  } else {  // this process alone: the same values, read here
    weights.resize(static_cast<std::size_t>(model.layout().total()));
    model::initialize_parameters(weights, model.layout(), recipe.seed);
    read_initial_weights(source, model.layout(), weights);
    model.load_parameters(weights);
  }
  if (!recipe.adapter.empty()) {  // every rank folds it in (the same files, the same sums)
    std::vector<float> folded = weights;
    (void)ckpt::apply_peft_adapter(recipe.adapter, model.layout(), folded);
    model.load_parameters(folded);
  }
  return weights;
}

AssembledModel assemble_model(const dist::World* world, kernels::Ops& ops,
                              const ModelSource& source, const ModelRecipe& recipe) {
  AssembledModel assembled = build_model(ops, source.config, recipe);
  (void)load_frozen_weights(world, ops, source, recipe, assembled);
  return assembled;
}

void attach_parallel(model::LlamaModel& model, parallel::DataParallel& parallel) {
  if (model::GradientWindow* window = parallel.gradient_window()) model.set_gradient_window(window);
  if (model::ParameterWindow* window = parallel.parameter_window())
    model.set_parameter_window(window);
}

std::optional<ckpt::PeftAdapter> load_adapter_on_every_rank(const dist::World& world,
                                                            const std::string& directory,
                                                            const model::ParameterLayout& layout) {
  std::optional<ckpt::PeftAdapter> adapter;
  std::exception_ptr failure;
  try {
    if (!directory.empty()) adapter.emplace(ckpt::load_peft_adapter(directory, layout));
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
  return adapter;
}

}  // namespace l3::train
