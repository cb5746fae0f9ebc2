// `eval` of a DPO checkpoint on preference data: the loss settings it trained with and its
// reference's log-probabilities of the data's pairs, found the cheapest way that is right:
//   1. a table the run stored (its manifest's reference "files": the training and validation
//      pairs) or one in eval's --reference-dir, when it was computed for this data (its content)
//      and this reference model: nothing to compute, and the reference model need not exist;
//   2. else computed with the reference model the checkpoint records (its digest checked), one
//      forward pass over the pairs, the model's weights whole or sharded over the ranks; stored
//      in --reference-dir when given, so that the next eval reads it.
// When the reference model is gone and no stored table fits, a bad_input Error says so, naming
// the model and the tables.
#pragma once

#include <string>

#include "ckpt/manifest.hpp"
#include "cli/command.hpp"
#include "io/data/dataset_index.hpp"
#include "kernels/ops.hpp"
#include "model/dpo_settings.hpp"
#include "model/llama_model.hpp"
#include "train/dpo_reference.hpp"
#include "train/evaluator.hpp"

namespace l3::cli {

struct DpoEvalReference {
  model::DpoSettings settings;
  train::ReferenceTable table;
  std::string origin;  // for the log: where the values came from
};

// Collective. `model` is the checkpoint's model, its weights not loaded yet: a computed
// reference goes through its buffers (or, `sharded`, a parameter window of the reference's own
// shares, which is dropped before returning: the caller sets the policy's).
[[nodiscard]] DpoEvalReference dpo_eval_reference(
    const CommandContext& context, const ckpt::Manifest& checkpoint, const std::string& step_dir,
    model::LlamaModel& model, kernels::Ops& ops, const data::DatasetIndex& index,
    const train::EvalConfig& config, bool sharded, const std::string& reference_dir);

}  // namespace l3::cli
