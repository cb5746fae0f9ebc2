#include "cli/eval_command.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>

#include "ckpt/peft_adapter.hpp"
#include "cli/dpo_eval_reference.hpp"
#include "cli/inference_model.hpp"
#include "core/error.hpp"
#include "core/option_domain.hpp"
#include "io/data/dataset_index.hpp"
#include "kernels/backend_options.hpp"
#include "kernels/backends.hpp"
#include "model/llama_model.hpp"
#include "parallel/context_group.hpp"
#include "parallel/sharded_weights.hpp"
#include "train/dpo_reference.hpp"
#include "train/evaluator.hpp"
#include "train/grpo/greedy_answers.hpp"
#include "train/grpo/prompt_set.hpp"
#include "train/lora_checkpoint_model.hpp"
#include "train/memory_check.hpp"
#include "train/model_assembly.hpp"
#include "train/model_source.hpp"
#include "train/train_config.hpp"

namespace l3::cli {

void declare_eval_options(po::options_description& options,
                          po::positional_options_description& /*positional*/) {
  options.add_options()(
      "init", po::value<std::string>()->value_name("CKPT"),
      "the model to evaluate: a checkpoint (step directory or root) or a Hugging Face model "
      "directory")("ckpt", po::value<std::string>()->value_name("CKPT"), "the same as --init")(
      "data", po::value<std::string>()->value_name("DIR"),
      "dataset: SFT data for a language model, preference data for a reward model; a DPO "
      "checkpoint takes either (SFT: loss and perplexity; preference: DPO's metrics); prompt "
      "data (prep prompts) for a language model, a GRPO checkpoint's say: the exact-answer "
      "accuracy of greedy completions, as grpo's evaluation computes it")(
      "max-completion-length",
      core::number<std::int64_t>(core::between(1, 1 << 20))->value_name("N"),
      "prompt data: new tokens per completion at most (default: the GRPO checkpoint's, else "
      "256)")("seq-len", core::number<std::int64_t>(core::between(1, 1 << 24))->value_name("N"),
              "tokens per row (default: the checkpoint's training --seq-len)")(
      "micro-batch",
      core::number<std::int64_t>(core::between(1, 1 << 24))->default_value(4)->value_name("N"),
      "rows or pairs per rank and forward pass")("drop-long", po::bool_switch(),
                                                 "leave out documents longer than --seq-len (SFT)")(
      "margin-from-data", po::bool_switch(), "use the records' margins (preference data)")(
      "backend", po::value<std::string>()->default_value("auto")->value_name("auto|cpu|cuda"),
      "compute backend")("ignore-tokenizer-mismatch", po::bool_switch(),
                         "evaluate even if the data was tokenized with another tokenizer")(
      "shard-parameters", po::bool_switch(),
      "hold 1/N of the weights per rank (a model larger than one rank's memory): each rank "
      "reads only its share, and each layer's weights are all-gathered before use")(
      "context-parallel",
      core::number<int>(core::between(1, 1 << 16))->default_value(1)->value_name("C"),
      "split every sequence over groups of C consecutive ranks, as training does (long "
      "sequences; SFT, preference and DPO evaluations on the CPU backend; --seq-len a multiple "
      "of 2C)")(
      "reference-dir", po::value<std::string>()->value_name("DIR"),
      "a DPO checkpoint on preference data: where its reference's log-probabilities of this data "
      "are stored once computed, and read the next time (the tables the run stored are read "
      "first)");
  declare_adapter_option(options);
}

namespace {

// Prompt data: the greedy completions' exact-answer accuracy (train/grpo/greedy_answers.hpp),
// decoded with the tokenizer the data was prepared with.
train::EvalMetrics evaluate_answers(const CommandContext& context, const train::ModelSource& source,
                                    model::LlamaModel& model, const data::DatasetIndex& index,
                                    std::int64_t seq_len) {
  const po::variables_map& o = context.options;
  std::int64_t max_new =
      source.checkpoint && source.checkpoint->phase == Phase::grpo
          ? source.checkpoint->config.value("max_completion_length", std::int64_t{256})
          : std::int64_t{256};
  if (o.count("max-completion-length") != 0)
    max_new = o["max-completion-length"].as<std::int64_t>();
  std::optional<tokenizer::Tokenizer> tokenizer;
  try {
    tokenizer = tokenizer::Tokenizer::load(index.tokenizer_name);
  } catch (const core::Error& e) {
    throw core::bad_input(
        fmt::format("the tokenizer it was prepared with ({}) cannot be loaded to decode the "
                    "completions: {}",
                    index.tokenizer_name, e.what()),
        {.file = index.directory});
  }
  const train::grpo::PromptSet set = train::grpo::PromptSet::load(context.world, index);
  return train::grpo::greedy_answers(context.world, model, set, *tokenizer,
                                     {.seq_len = seq_len, .max_completion_length = max_new});
}

}  // namespace

int run_eval(const CommandContext& context) {
  const po::variables_map& o = context.options;
  if (o.count("init") != 0 && o.count("ckpt") != 0)
    throw core::usage_error("give --init or --ckpt, not both");
  if (o.count("init") == 0 && o.count("ckpt") == 0)
    throw core::usage_error("--init CKPT is required (the checkpoint to evaluate)");
  if (o.count("data") == 0) throw core::usage_error("--data DIR is required");
  const std::string init =
      o.count("init") != 0 ? o["init"].as<std::string>() : o["ckpt"].as<std::string>();
  const train::ModelSource source = train::resolve_model_source("", init);
  // With --adapter the adapter's task decides: a SEQ_CLS one makes a reward model of its base.
  const std::string adapter = adapter_option(o);
  const model::HeadKind head = adapter.empty()
                                   ? source.initial_head().value_or(model::HeadKind::language_model)
                                   : ckpt::read_peft_adapter_config(adapter).head;

  std::int64_t seq_len = source.checkpoint
                             ? source.checkpoint->config.value("seq_len", std::int64_t{2048})
                             : std::int64_t{2048};
  if (o.count("seq-len") != 0 && !o["seq-len"].defaulted()) {
    seq_len = o["seq-len"].as<std::int64_t>();
    if (seq_len > source.config.max_position_embeddings) {
      throw core::usage_error(
          fmt::format("--seq-len {} is beyond the model's {} positions (max_position_embeddings)",
                      seq_len, source.config.max_position_embeddings));
    }
  }
  seq_len = std::min(seq_len, source.config.max_position_embeddings);
  if (seq_len <= 0) throw core::usage_error("--seq-len must be positive");
  const std::int64_t micro = o["micro-batch"].as<std::int64_t>();
  if (micro <= 0) throw core::usage_error("--micro-batch must be positive");

  const auto ops = kernels::make_ops(kernels::parse_backend(o["backend"].as<std::string>()),
                                     context.world.local_rank());
  const bool sharded = o["shard-parameters"].as<bool>();
  const int ranks = context.world.size();
  // Context parallelism: each rank holds 1/C of every row (parallel::ContextGroup).
  const int cp = o["context-parallel"].as<int>();
  if (ranks % cp != 0) {
    throw core::usage_error(fmt::format(
        "--context-parallel {}: the {} ranks must split into groups of {} (a divisor of {})", cp,
        ranks, cp, ranks));
  }
  if (seq_len % (2 * cp) != 0) {
    throw core::usage_error(fmt::format(
        "--context-parallel {}: --seq-len {} must be a multiple of {} (each row is cut into "
        "2 x {} chunks)",
        cp, seq_len, 2 * cp, cp));
  }
  if (cp > 1 && ops->backend() != kernels::Backend::cpu) {
    throw core::usage_error(
        "--context-parallel: the CPU backend only so far (the CUDA attention takes no query "
        "rows yet)");
  }
  // Refused only when it cannot fit in any case: a pair planned as one row (as in training).
  const std::int64_t rows = micro;
  std::int64_t weights =
      model::model_bytes(source.config, head, ops->compute_dtype(), false, rows * seq_len / cp,
                         seq_len, /*own_gradients=*/false, {}, cp);
  if (sharded) {
    // The share and two gathered layer groups (and the tied embedding) instead of the weights.
    const model::ParameterLayout layout(source.config, head);
    const auto width = static_cast<std::int64_t>(kernels::dtype_size(ops->compute_dtype()));
    weights += width * ((layout.total() + ranks - 1) / ranks +
                        model::gradient_slot_elements(layout) - layout.total());
  }
  train::require_memory(context.world, *ops,
                        {.backend = {{"the model and one micro-batch's activations", weights}},
                         .host = train::prefetch_host_bytes(rows, seq_len, 2),
                         .remedy = sharded ? "--micro-batch or --seq-len, or more ranks"
                                           : "--micro-batch or --seq-len, or --shard-parameters "
                                             "on several ranks"});
  // Forward passes only: neither gradients nor (in bf16) an fp32 master copy, which would take
  // 2 + 4 bytes per parameter for nothing (48 GB for an 8B model).
  const train::ModelRecipe recipe{.purpose = train::ModelPurpose::evaluate,
                                  .head = head,
                                  .placement = model::Placement::frozen(sharded, ranks),
                                  .adapter = adapter};
  train::AssembledModel assembled = train::build_model(*ops, source.config, recipe);
  model::LlamaModel& model = *assembled.model;

  // A DPO checkpoint is a language model: on preference data it is evaluated as DPO, against
  // the reference its manifest records; on SFT data as any language model (loss, perplexity).
  const bool dpo_checkpoint =
      source.checkpoint && source.checkpoint->phase == Phase::dpo && adapter.empty();
  const std::string data_dir = o["data"].as<std::string>();
  const std::optional<data::SampleKind> data_kind = data::dataset_kind(context.world, data_dir);
  // A language model on prompt data: greedy completions scored against the records' answers.
  const bool prompts =
      head == model::HeadKind::language_model && data_kind == data::SampleKind::prompt;
  if (o.count("max-completion-length") != 0 && !prompts)
    throw core::usage_error("--max-completion-length is for prompt data (prep prompts)");
  if (prompts && cp > 1) {
    throw core::usage_error(
        "--context-parallel: not on prompt data (its completions are generated per rank)");
  }
  std::unique_ptr<parallel::ContextGroup> group;
  if (cp > 1) {
    group = std::make_unique<parallel::ContextGroup>(context.world, cp);
    model.set_context_exchange(group.get());
  }
  data::DatasetExpectations expect;
  expect.kind = head == model::HeadKind::reward ? data::SampleKind::preference
                : prompts                       ? data::SampleKind::prompt
                : dpo_checkpoint && data_kind.value_or(data::SampleKind::preference) ==
                                        data::SampleKind::preference
                    ? data::SampleKind::preference
                    : data::SampleKind::sft;
  const bool dpo = dpo_checkpoint && expect.kind == data::SampleKind::preference;
  expect.model_vocab = source.config.vocab_size;
  if (source.checkpoint) expect.model_tokenizer_sha256 = source.checkpoint->tokenizer_sha256;
  expect.ignore_tokenizer_mismatch = o["ignore-tokenizer-mismatch"].as<bool>();
  const data::DatasetIndex index = data::open_dataset(context.world, data_dir, expect);
  const std::string reference_dir =
      o.count("reference-dir") != 0 ? o["reference-dir"].as<std::string>() : std::string();
  if (!reference_dir.empty() && !dpo) {
    throw core::usage_error(
        "--reference-dir is for a DPO checkpoint on preference data (where its reference's "
        "log-probabilities are kept)");
  }

  train::EvalConfig config;
  config.seq_len = seq_len;
  config.micro_batch = micro;
  config.drop_long = o["drop-long"].as<bool>();
  config.margin_from_data = o["margin-from-data"].as<bool>();
  config.context_ranks = cp;
  train::ReferenceTable reference;
  if (dpo) {
    if (!index.has_response_masks()) {
      throw core::bad_input(
          "its pairs have no response masks (prepared by an earlier llama3-hpc): run 'llama3-hpc "
          "prep preference' on it again to evaluate a DPO model",
          {.file = data_dir});
    }
    // Before the policy's weights: a reference computed now goes through the model's buffers.
    DpoEvalReference r = dpo_eval_reference(context, *source.checkpoint, source.step_dir, model,
                                            *ops, index, config, sharded, reference_dir);
    config.dpo = r.settings;
    reference = std::move(r.table);
    config.reference = &reference;
    context.log.info("DPO reference ({} pairs): {}", index.samples(), r.origin);
  }

  // The weights evaluated, whole or sharded, with the adapter folded in.
  (void)train::load_frozen_weights(&context.world, *ops, source, recipe, assembled);
  train::EvalMetrics m = prompts ? evaluate_answers(context, source, model, index, seq_len)
                                 : train::evaluate(context.world, model, index, config);
  if (source.checkpoint) m.step = source.checkpoint->step;  // the step the checkpoint holds
  context.log.info("{} (model {}{}, {} rank{})", train::format_eval_line(m), source.origin(),
                   adapter.empty() ? "" : " with the adapter " + adapter, context.world.size(),
                   context.world.size() == 1 ? "" : "s");
  if (m.skipped_samples > 0) {
    context.log.warn("{} samples longer than --seq-len {} were left out", m.skipped_samples,
                     seq_len);
  }
  if (context.world.is_root()) {
    nlohmann::json result = train::eval_result_json(m);
    result["skipped_samples"] = m.skipped_samples;  // 0 when none: always there to read
    std::cout << result.dump() << '\n' << std::flush;
  }
  return core::kExitOk;
}

}  // namespace l3::cli
