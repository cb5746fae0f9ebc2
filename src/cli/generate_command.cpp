#include "cli/generate_command.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/generation_job.hpp"
#include "cli/inference_model.hpp"
#include "cli/prompt_format.hpp"
#include "cli/stop_signals.hpp"
#include "core/deadline.hpp"
#include "core/error.hpp"
#include "core/option_domain.hpp"
#include "core/timer.hpp"
#include "io/tokenizer/utf8.hpp"
#include "kernels/backend_options.hpp"
#include "model/generator.hpp"

namespace l3::cli {

void declare_generate_options(po::options_description& options,
                              po::positional_options_description& /*positional*/) {
  declare_inference_model_options(options);
  options.add_options()("prompt", po::value<std::string>()->value_name("TEXT"),
                        "the text to continue (with --chat: the user's message)")(
      "chat", po::bool_switch(),
      "format the prompt as a user turn of the Llama 3 chat template and generate the "
      "assistant's answer")("system", po::value<std::string>()->value_name("TEXT"),
                            "with --chat: a system turn before the user's")(
      "max-new",
      core::number<std::int64_t>(core::between(0, 1 << 24))->default_value(128)->value_name("N"),
      "new tokens at most")(
      "temperature", core::number<double>(core::at_least(0))->default_value(0.0)->value_name("T"),
      "0: greedy; otherwise sample from softmax(logits / T)")(
      "top-p",
      core::number<double>(core::Domain{.lowest = 0, .lowest_excluded = true, .highest = 1})
          ->default_value(1.0)
          ->value_name("P"),
      "sample only from the most likely tokens whose probabilities add up to P")(
      "top-k",
      core::number<std::int64_t>(core::between(0, 1 << 24))->default_value(0)->value_name("K"),
      "sample only from the K most likely tokens (0: no limit)")(
      "seed", core::number<std::uint64_t>(core::Domain{})->default_value(0)->value_name("S"),
      "seed of the sampling: the same seed gives the same text")(
      "json", po::bool_switch(),
      "print one JSON line: prompt_tokens, new_tokens, text, stopped, tokens_per_s, seconds")(
      "logprobs", po::bool_switch(),
      "with --json: also prompt_ids, new_ids, logprobs (log p of each new token under the "
      "model: log-softmax of the raw logits, before temperature, top-k and top-p, as "
      "transformers' and vLLM's defaults) and prompt_logprobs (log p of each prompt token "
      "after the first, given the ones before it); with --input: logprobs and prompt_ids in each "
      "line")("tempered-logprobs", po::bool_switch(),
              "with --logprobs: log-softmax of logits / --temperature instead (the distribution "
              "the tokens are drawn from before top-k and top-p; what grpo trains with)")(
      "input", po::value<std::string>()->value_name("FILE.jsonl"),
      R"(a batch job: complete every record of a JSONL file (plain or .gz), {"prompt": )"
      R"(TEXT} or {"messages": [...]}, on every rank (needs --output))")(
      "output", po::value<std::string>()->value_name("FILE.jsonl"),
      "with --input: the completions, one JSON line each, in input order")(
      "num-samples",
      core::number<std::int64_t>(core::between(0, 1 << 20))->default_value(1)->value_name("K"),
      "with --input: completions per record")(
      "stop", po::value<std::vector<std::string>>()->composing()->value_name("TEXT"),
      "with --input: end a completion where this text appears (cut before it; repeatable)")(
      "batch-size", core::number<std::int64_t>(core::between(0, 1 << 24))->value_name("N"),
      "with --input: sequences in flight per rank (default: as many as fit in memory, at most "
      "64)")("deadline", po::value<std::string>()->value_name("SECONDS|TIME"),
             "with --input: save the progress and exit 75 before this: seconds from now or an "
             "ISO-8601 time (default: SLURM_JOB_END_TIME when set)")(
      "backend", po::value<std::string>()->value_name("auto|cpu|cuda"),
      "with --input: compute backend (default auto: cuda when built with it and a device is "
      "visible, else cpu)")(
      "shard-parameters", po::bool_switch(),
      "with --input on N ranks: hold 1/N of the weights per rank; every rank takes part in every "
      "pass")("dry-run-memory", po::bool_switch(),
              "with --input: print the memory plan per rank (the weights, the KV cache) and "
              "exit");
}

namespace {

// --tempered-logprobs: only with --logprobs and a sampling temperature (at 0, greedy, there is
// no temperature to divide by).
bool tempered_logprobs_option(const po::variables_map& o) {
  if (!o["tempered-logprobs"].as<bool>()) return false;
  if (!o["logprobs"].as<bool>()) throw core::usage_error("--tempered-logprobs needs --logprobs");
  if (o["temperature"].as<double>() <= 0) {
    throw core::usage_error(
        "--tempered-logprobs needs --temperature T > 0 (greedy decoding has no temperature to "
        "divide the logits by)");
  }
  return true;
}

// `generate --input`: the options of the batch job, checked on every rank.
int run_generate_file(const CommandContext& context, const std::string& model_path) {
  const po::variables_map& o = context.options;
  for (const char* interactive : {"chat", "json"}) {
    if (o[interactive].as<bool>()) {
      throw core::usage_error(fmt::format(
          "--{} is for --prompt; with --input every record is a chat prompt and every line JSON",
          interactive));
    }
  }
  if (o.count("system") > 0) {
    throw core::usage_error(R"(--system is for --prompt; with --input give "messages" records)");
  }
  GenerationJob job;
  job.model_path = model_path;
  job.adapter = adapter_option(o);
  if (o.count("tokenizer") > 0) job.tokenizer = o["tokenizer"].as<std::string>();
  job.ignore_tokenizer_mismatch = o["ignore-tokenizer-mismatch"].as<bool>();
  job.input = o["input"].as<std::string>();
  job.dry_run_memory = o["dry-run-memory"].as<bool>();
  if (o.count("output") > 0) {
    job.output = o["output"].as<std::string>();
  } else if (!job.dry_run_memory) {
    throw core::usage_error("--input needs --output FILE.jsonl");
  }
  job.num_samples = o["num-samples"].as<std::int64_t>();
  if (job.num_samples < 1) {
    throw core::usage_error(
        fmt::format("--num-samples must be at least 1, not {}", job.num_samples));
  }
  job.max_new = o["max-new"].as<std::int64_t>();
  job.sampling = model::SamplingSettings{.temperature = o["temperature"].as<double>(),
                                         .top_p = o["top-p"].as<double>(),
                                         .top_k = o["top-k"].as<std::int64_t>(),
                                         .seed = o["seed"].as<std::uint64_t>()};
  model::validate(job.sampling);
  if (o.count("stop") > 0) job.stop_strings = o["stop"].as<std::vector<std::string>>();
  for (const std::string& stop : job.stop_strings) {
    if (stop.empty()) throw core::usage_error("--stop must not be empty");
    if (tokenizer::first_invalid_utf8(stop)) {
      throw core::usage_error(
          fmt::format("--stop: not valid UTF-8 at byte {}", *tokenizer::first_invalid_utf8(stop)));
    }
  }
  job.logprobs = o["logprobs"].as<bool>();
  job.sampling.tempered_logprobs = tempered_logprobs_option(o);
  if (o.count("batch-size") > 0) {
    job.batch_size = o["batch-size"].as<std::int64_t>();
    if (job.batch_size < 1) throw core::usage_error("--batch-size must be at least 1");
  }
  if (o.count("deadline") > 0) {
    job.deadline_unix = core::parse_deadline(o["deadline"].as<std::string>(), core::unix_now());
  } else {
    const core::SlurmEndTime slurm = core::slurm_end_time(std::getenv("SLURM_JOB_END_TIME"));
    if (!slurm.problem.empty()) context.log.warn("{}", slurm.problem);
    job.deadline_unix = slurm.time;
  }
  job.shard_parameters = o["shard-parameters"].as<bool>();
  if (o.count("backend") > 0) job.backend = kernels::parse_backend(o["backend"].as<std::string>());
  return run_generation_job(context, job);
}

}  // namespace

int run_generate(const CommandContext& context) {
  const po::variables_map& o = context.options;
  // Cheap checks first, on every rank (one error line under mpiexec): nobody waits for a model
  // to load to learn of a typo.
  const std::string path = model_path_option(o);
  const bool file = o.count("input") > 0;
  if (file && o.count("prompt") > 0) throw core::usage_error("give --prompt or --input, not both");
  if (file) return run_generate_file(context, path);
  // An interactive tool: the default actions of signals, as before the batch job had them.
  restore_default_signals();
  if (o.count("prompt") == 0) throw core::usage_error("--prompt TEXT or --input FILE is required");
  for (const char* batch_only : {"output", "stop", "batch-size", "deadline", "backend"}) {
    if (o.count(batch_only) > 0)
      throw core::usage_error(fmt::format("--{} needs --input", batch_only));
  }
  for (const char* batch_only : {"shard-parameters", "dry-run-memory"}) {
    if (o[batch_only].as<bool>())
      throw core::usage_error(fmt::format("--{} needs --input", batch_only));
  }
  if (!o["num-samples"].defaulted()) throw core::usage_error("--num-samples needs --input");
  const bool chat = o["chat"].as<bool>();
  std::optional<std::string> system;
  if (o.count("system") > 0) {
    if (!chat) throw core::usage_error("--system needs --chat");
    system = o["system"].as<std::string>();
  }
  model::GenerationOptions options;
  options.max_new = o["max-new"].as<std::int64_t>();
  options.temperature = o["temperature"].as<double>();
  options.top_p = o["top-p"].as<double>();
  options.seed = o["seed"].as<std::uint64_t>();
  options.top_k = o["top-k"].as<std::int64_t>();
  if (options.max_new < 0) throw core::usage_error("--max-new must be >= 0");
  const bool logprobs = o["logprobs"].as<bool>();
  if (logprobs && !o["json"].as<bool>()) throw core::usage_error("--logprobs needs --json");
  options.prompt_logprobs = logprobs;
  options.tempered_logprobs = tempered_logprobs_option(o);
  model::validate(model::SamplingSettings{
      .temperature = options.temperature, .top_p = options.top_p, .top_k = options.top_k});
  if (!context.world.is_root()) return core::kExitOk;  // an interactive tool: one rank works

  const core::Stopwatch load_time;
  const InferenceModel loaded =
      load_inference_model(path, model::HeadKind::language_model, train::ModelPurpose::generate,
                           nullptr, adapter_option(o));
  const tokenizer::Tokenizer tokenizer = load_inference_tokenizer(o, loaded, context.log);
  context.log.info(
      "loaded {}{} (step {}, {:.1f} M parameters) in {:.1f} s", loaded.step_dir,
      loaded.adapter.empty() ? "" : " with the adapter " + loaded.adapter, loaded.manifest.step,
      static_cast<double>(loaded.model->layout().parameter_count()) / 1e6, load_time.seconds());

  const std::vector<std::int32_t> prompt =
      generation_prompt(tokenizer, o["prompt"].as<std::string>(), chat, system);
  options.stop_tokens = {tokenizer.special(tokenizer::Special::end_of_turn),
                         tokenizer.special(tokenizer::Special::end_of_text)};
  options.vocab_limit = tokenizer.vocab_size();
  model::Generator generator(*loaded.model);
  const core::Stopwatch time;
  const model::GenerationResult result = generator.generate(prompt, options);
  const double seconds = time.seconds();
  const std::string text = tokenizer.decode(result.tokens);
  const auto count = static_cast<std::int64_t>(result.tokens.size());
  const double rate = seconds > 0.0 ? static_cast<double>(count) / seconds : 0.0;
  context.log.info("{} prompt tokens, {} new tokens{} in {:.2f} s ({:.1f} tokens/s)", prompt.size(),
                   count, result.stopped ? " (stop token)" : "", seconds, rate);

  if (o["json"].as<bool>()) {
    nlohmann::ordered_json line = {
        {"prompt_tokens", prompt.size()}, {"new_tokens", count},  {"text", text},
        {"stopped", result.stopped},      {"tokens_per_s", rate}, {"seconds", seconds}};
    if (logprobs) {
      line["prompt_ids"] = prompt;
      line["new_ids"] = result.tokens;
      line["logprobs"] = result.logprobs;
      line["prompt_logprobs"] = result.prompt_logprobs;
    }
    // The decoded bytes may cut a UTF-8 character: invalid sequences become U+FFFD.
    std::cout << line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
              << '\n';
  } else {
    std::cout << text << '\n';
  }
  std::cout.flush();
  return core::kExitOk;
}

}  // namespace l3::cli
