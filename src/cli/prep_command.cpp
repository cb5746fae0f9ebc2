#include "cli/prep_command.hpp"

#include <fmt/format.h>

#include <iostream>

#include "core/error.hpp"
#include "core/option_domain.hpp"
#include "io/prep/prep_job.hpp"

namespace l3::cli {

void declare_prep_options(po::options_description& options,
                          po::positional_options_description& positional) {
  options.add_options()("kind", po::value<std::string>()->value_name("sft|preference|prompts"),
                        "what the records are (positional)")(
      "input", po::value<std::vector<std::string>>()->composing()->value_name("FILE|GLOB"),
      "JSONL input, plain or .gz; repeatable, globs expanded")(
      "tokenizer", po::value<std::string>()->value_name("FILE|bytes"),
      "tokenizer.model, tokenizer.json, a model directory, or the built-in 'bytes'")(
      "output", po::value<std::string>()->value_name("DIR"), "the dataset directory to create")(
      "max-len",
      core::number<std::int64_t>(core::between(0, 1 << 24))->default_value(0)->value_name("N"),
      "longest sequence in tokens (0: no limit)")(
      "truncate", po::value<std::string>()->default_value("drop")->value_name("drop|left"),
      "over --max-len: drop the record, or cut the prompt from the left")(
      "template", po::value<std::string>()->default_value("chat")->value_name("chat|raw"),
      "prompt/completion records: Llama 3 chat turns, or BOS + prompt + completion + "
      "<|end_of_text|>")("last-turn-only", po::bool_switch(),
                         "messages records: loss on the last assistant turn only")(
      "shard-tokens",
      core::number<std::int64_t>(core::between(1, 1e12))
          ->default_value(256'000'000)
          ->value_name("N"),
      "tokens per shard (about 5 bytes each in memory while a shard is built)")(
      "val-fraction",
      core::number<double>(core::Domain{.lowest = 0, .highest = 1, .highest_excluded = true})
          ->default_value(0.0)
          ->value_name("F"),
      "put this fraction of the records in DIR/val, the rest in DIR/train")(
      "seed", core::number<std::uint64_t>(core::Domain{})->default_value(1234),
      "seed of the validation split")("skip-bad", po::bool_switch(),
                                      "skip and count malformed records instead of stopping")(
      "overwrite", po::bool_switch(),
      "replace an existing DIR (only once the new dataset is complete)");
  positional.add("kind", 1);
}

int run_prep(const CommandContext& context) {
  const po::variables_map& o = context.options;
  prep::PrepOptions options;
  if (o.count("kind") == 0)
    throw core::usage_error("say what to prepare: 'prep sft', 'prep preference' or 'prep prompts'");
  const std::string kind = o["kind"].as<std::string>();
  if (kind != "sft" && kind != "preference" && kind != "prompts") {
    throw core::usage_error(
        fmt::format("unknown dataset kind '{}' (use sft, preference or prompts)", kind));
  }
  options.kind = kind == "sft"          ? prep::DatasetKind::sft
                 : kind == "preference" ? prep::DatasetKind::preference
                                        : prep::DatasetKind::prompts;
  for (const char* required : {"input", "tokenizer", "output"}) {
    if (o.count(required) == 0) throw core::usage_error(fmt::format("--{} is required", required));
  }
  options.inputs = o["input"].as<std::vector<std::string>>();
  options.tokenizer = o["tokenizer"].as<std::string>();
  options.output = o["output"].as<std::string>();
  options.format.max_len = o["max-len"].as<std::int64_t>();
  const std::string truncate = o["truncate"].as<std::string>();
  const std::string templ = o["template"].as<std::string>();
  if (truncate != "drop" && truncate != "left")
    throw core::usage_error("--truncate must be drop or left");
  if (templ != "chat" && templ != "raw") throw core::usage_error("--template must be chat or raw");
  options.format.truncation = truncate == "drop" ? prep::Truncation::drop : prep::Truncation::left;
  options.format.prompt_template = templ == "chat" ? prep::Template::chat : prep::Template::raw;
  options.format.last_turn_only = o["last-turn-only"].as<bool>();
  options.shard_tokens = o["shard-tokens"].as<std::int64_t>();
  options.val_fraction = o["val-fraction"].as<double>();
  options.seed = o["seed"].as<std::uint64_t>();
  options.skip_bad = o["skip-bad"].as<bool>();
  options.overwrite = o["overwrite"].as<bool>();
  if (options.format.max_len < 0) throw core::usage_error("--max-len must be >= 0");
  if (options.shard_tokens <= 0) throw core::usage_error("--shard-tokens must be positive");
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0)) {
    throw core::usage_error("--val-fraction must be in [0, 1)");
  }

  const prep::PrepSummary s = prep::run_prep(context.world, context.log, options);
  if (context.world.is_root()) {
    std::string dropped;
    for (const auto& [reason, count] : s.dropped) dropped += fmt::format(" {} {}", reason, count);
    std::cout << fmt::format(
        "prep {}: {} records read, {} kept ({} train, {} val), dropped:{}\n"
        "  {} tokens{}, {} shard{} in {} ({} rank{})\n"
        "  {:.1f} s, {:.1f} MB/s of input\n",
        kind, s.records, s.kept, s.train, s.validation, dropped.empty() ? " none" : dropped,
        s.tokens,
        options.kind == prep::DatasetKind::sft ? fmt::format(" ({} loss tokens)", s.loss_tokens)
                                               : "",
        s.shards, s.shards == 1 ? "" : "s", options.output, context.world.size(),
        context.world.size() == 1 ? "" : "s", s.seconds,
        s.seconds > 0 ? static_cast<double>(s.input_bytes) / 1e6 / s.seconds : 0.0);
  }
  return core::kExitOk;
}

}  // namespace l3::cli
