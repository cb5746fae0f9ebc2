#include "cli/generate_command.hpp"

#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/inference_model.hpp"
#include "cli/prompt_format.hpp"
#include "core/error.hpp"
#include "core/option_domain.hpp"
#include "core/timer.hpp"
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
      "seed", core::number<std::uint64_t>(core::Domain{})->default_value(0)->value_name("S"),
      "seed of the sampling: the same seed gives the same text")(
      "json", po::bool_switch(),
      "print one JSON line: prompt_tokens, new_tokens, text, stopped, tokens_per_s, seconds")(
      "logprobs", po::bool_switch(),
      "with --json: also prompt_ids, new_ids, logprobs (log p of each new token under the "
      "model, before temperature and top-p) and prompt_logprobs (log p of each prompt token "
      "after the first, given the ones before it)");
}

int run_generate(const CommandContext& context) {
  const po::variables_map& o = context.options;
  // Cheap checks first, on every rank (one error line under mpiexec): nobody waits for a model
  // to load to learn of a typo.
  const std::string path = model_path_option(o);
  if (o.count("prompt") == 0) throw core::usage_error("--prompt TEXT is required");
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
  if (options.max_new < 0) throw core::usage_error("--max-new must be >= 0");
  const bool logprobs = o["logprobs"].as<bool>();
  if (logprobs && !o["json"].as<bool>()) throw core::usage_error("--logprobs needs --json");
  options.prompt_logprobs = logprobs;
  model::validate(model::SamplingSettings{.temperature = options.temperature, .top_p = options.top_p});
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
