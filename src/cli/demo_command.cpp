#include "cli/demo_command.hpp"

#include <fmt/format.h>

#include <array>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>

#include "cli/demo_data.hpp"
#include "cli/export_command.hpp"
#include "cli/inference_model.hpp"
#include "cli/prompt_format.hpp"
#include "cli/train_command.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/option_domain.hpp"
#include "core/path_safety.hpp"
#include "core/timer.hpp"
#include "core/words.hpp"
#include "dist/collectives.hpp"
#include "io/prep/prep_job.hpp"
#include "io/tokenizer/special_tokens.hpp"
#include "l3/l3.hpp"
#include "model/generator.hpp"
#include "report/html_report.hpp"
#include "train/metrics.hpp"

namespace l3::cli {

namespace fs = std::filesystem;

namespace {

constexpr int kRecords = 2000;
constexpr int kDemoLoraRank = 8;

// What the demo writes into its --workdir: these names, and nothing else. A directory is
// replaced by the next demo only when it holds the marker (with this text) and nothing but
// these entries; the code below writes through these names.
constexpr std::string_view kMarker = ".llama3-hpc-demo";
constexpr std::string_view kMarkerText =
    "a llama3-hpc demo directory: the demo replaces what is here\n";
constexpr std::string_view kInputDir = "input";                // the JSONL records it writes
constexpr std::string_view kSftData = "sft";                   // prep's dataset of them
constexpr std::string_view kPairData = "preferences";          // prep's dataset of the pairs
constexpr std::string_view kPromptData = "prompts";            // prep's dataset of GRPO's prompts
constexpr std::string_view kCheckpoints = "ckpt";              // ckpt/<phase>/
constexpr std::string_view kRewardAdapter = "reward-adapter";  // with --lora
constexpr std::string_view kTensorBoard = "tensorboard";       // tensorboard/<phase>/
constexpr std::string_view kReport = "report.html";            // the metrics drawn
constexpr std::array kDemoPhases{l3::Phase::sft, l3::Phase::reward, l3::Phase::dpo,
                                 l3::Phase::grpo};
constexpr int kPromptRecords = 400;
// GRPO's sizes: prompts per step (on any number of ranks up to 8), completions of each.
constexpr int kGrpoPrompts = 8;
constexpr int kGrpoGenerations = 8;

std::string metrics_file_name(l3::Phase phase) {
  return fmt::format("metrics-{}.jsonl", train::phase_name(phase));
}

// Every entry the demo writes directly in its workdir.
std::vector<core::KnownEntry> demo_entries(const std::vector<std::string>& metrics_names) {
  std::vector<core::KnownEntry> entries{
      {kMarker, false},       {kInputDir, true},    {kSftData, true},
      {kPairData, true},      {kPromptData, true},  {kCheckpoints, true},
      {kRewardAdapter, true}, {kTensorBoard, true}, {kReport, false}};
  for (const std::string& name : metrics_names) entries.push_back({name, false});
  return entries;
}

// Why `dir` is not a demo directory (a sentence), or "".
std::string why_not_demo(const fs::path& dir) {
  if (!core::is_real_directory(dir)) return "it is not a directory (or is a symbolic link)";
  std::vector<std::string> metrics;
  metrics.reserve(kDemoPhases.size());
  for (const l3::Phase phase : kDemoPhases) metrics.push_back(metrics_file_name(phase));
  const std::vector<core::KnownEntry> entries = demo_entries(metrics);
  if (fs::is_empty(dir)) return {};
  if (std::string why = core::unknown_entry(dir, entries, "the demo"); !why.empty()) return why;
  if (core::read_small_regular_file(dir / kMarker) != kMarkerText)
    return fmt::format("it has no {} marker of the demo's: not a demo directory", kMarker);
  return {};
}

// Bytes of the files directly in a directory (a checkpoint step directory).
std::uintmax_t directory_bytes(const std::string& dir) {
  std::uintmax_t bytes = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file()) bytes += entry.file_size();
  return bytes;
}

std::string prepare(const CommandContext& context, prep::DatasetKind kind, const std::string& input,
                    const std::string& output) {
  prep::PrepOptions o;
  o.kind = kind;
  o.inputs = {input};
  o.tokenizer = "bytes";
  o.output = output;
  o.val_fraction = 0.1;
  o.overwrite = true;
  const prep::PrepSummary s = prep::run_prep(context.world, context.log, o);
  context.log.info("demo: prepared {} ({} train / {} validation records, {} tokens)", output,
                   s.train, s.validation, s.tokens);
  return output;
}

// The demo's runs, configured as a host would through the public API (include/l3/l3.hpp).
l3::RunConfig demo_config(const CommandContext& context, l3::Phase phase, const std::string& root) {
  const po::variables_map& o = context.options;
  const int ranks = context.world.size();
  // A global batch of about 16 on any rank count; GRPO: 8 prompts of 8 completions each.
  const bool grpo = phase == l3::Phase::grpo;
  const int micro = grpo ? kGrpoPrompts * kGrpoGenerations / std::min(ranks, kGrpoPrompts)
                         : std::max(1, 16 / ranks);
  const int global = grpo ? kGrpoPrompts : micro * ranks;
  const std::string name(train::phase_name(phase));
  std::vector<std::string> args{name,
                                "--backend",
                                "cpu",
                                "--seq-len",
                                "256",
                                "--micro-batch",
                                std::to_string(micro),
                                "--global-batch",
                                std::to_string(global),
                                "--weight-decay",
                                "0",
                                "--log-every",
                                "50",
                                "--seed",
                                "1",
                                "--metrics",
                                fmt::format("{}/{}", root, metrics_file_name(phase)),
                                "--ckpt-dir",
                                fmt::format("{}/{}/{}", root, kCheckpoints, name),
                                "--tensorboard",
                                fmt::format("{}/{}/{}", root, kTensorBoard, name),
                                "--log-level",
                                o["log-level"].as<std::string>()};
  if (o["log-all-ranks"].as<bool>()) args.emplace_back("--log-all-ranks");
  const auto add = [&](std::initializer_list<std::string> more) {
    args.insert(args.end(), more.begin(), more.end());
  };
  const auto under = [&](std::string_view dir, std::string_view leaf) {
    return fmt::format("{}/{}/{}", root, dir, leaf);
  };
  const std::string sft_checkpoint = under(kCheckpoints, train::phase_name(l3::Phase::sft));
  if (phase == l3::Phase::sft) {
    add({"--model", o["model"].as<std::string>(), "--data", under(kSftData, "train"), "--val-data",
         under(kSftData, "val"), "--steps", std::to_string(o["sft-steps"].as<std::int64_t>()),
         "--lr", "3e-3", "--warmup", "20"});
  } else if (grpo) {
    // The SFT model on prompts with exact answers, rewarded 1 for the answer itself; sampled at
    // 0.7 (fewer garbled completions from a model this small), a small learning rate. 40 steps
    // at 5e-5 raise the held-out accuracy from SFT models trained on 1 or 2 ranks alike (20 at
    // 1e-4 did from one and not from the other: 42 prompts, and the last bits of the SFT model).
    const std::string steps = std::to_string(o["grpo-steps"].as<std::int64_t>());
    add({"--init",
         sft_checkpoint,
         "--data",
         under(kPromptData, "train"),
         "--val-data",
         under(kPromptData, "val"),
         "--steps",
         steps,
         "--eval-every",
         steps,
         "--reward-match",
         "answer",
         "--num-generations",
         std::to_string(kGrpoGenerations),
         "--max-completion-length",
         "24",
         "--temperature",
         "0.7",
         "--lr",
         "5e-5",
         "--warmup",
         "0"});
  } else if (phase == l3::Phase::dpo) {
    // The policy itself on the same pairs, from the SFT checkpoint (also the reference).
    add({"--init", sft_checkpoint, "--data", under(kPairData, "train"), "--val-data",
         under(kPairData, "val"), "--steps", std::to_string(o["dpo-steps"].as<std::int64_t>()),
         "--warmup", "10", "--beta", "0.1"});
    if (o["lora"].as<bool>()) {
      add({"--lr", "3e-3", "--lora-rank", std::to_string(kDemoLoraRank), "--lora-alpha",
           std::to_string(2 * kDemoLoraRank)});
    } else {
      add({"--lr", "3e-4"});
    }
  } else {
    add({"--init", sft_checkpoint, "--data", under(kPairData, "train"), "--val-data",
         under(kPairData, "val"), "--steps", std::to_string(o["reward-steps"].as<std::int64_t>()),
         "--warmup", "10"});
    // LoRA learns with a larger rate than full fine-tuning: the adapters start at zero.
    if (o["lora"].as<bool>()) {
      add({"--lr", "3e-3", "--lora-rank", std::to_string(kDemoLoraRank), "--lora-alpha",
           std::to_string(2 * kDemoLoraRank)});
    } else {
      add({"--lr", "1e-3"});
    }
  }
  return l3::RunConfig::from_args(args);
}

// What the fine-tuned model answers to a few held-out-style prompts (greedy, rank 0).
std::string generation_samples(const std::string& checkpoint, const core::Logger& log) {
  const InferenceModel loaded = load_inference_model(checkpoint, model::HeadKind::language_model,
                                                     train::ModelPurpose::generate);
  const tokenizer::Tokenizer tok = load_inference_tokenizer(std::nullopt, loaded, false, log);
  model::Generator generator(*loaded.model);
  model::GenerationOptions options;
  options.max_new = 24;
  options.stop_tokens = {tok.special(tokenizer::Special::end_of_turn),
                         tok.special(tokenizer::Special::end_of_text)};
  options.vocab_limit = tok.vocab_size();
  std::string text;
  for (const char* prompt :
       {"Reverse the word garden.", "What is 4 plus 3?", "Write rocket in capital letters."}) {
    const model::GenerationResult r =
        generator.generate(generation_prompt(tok, prompt, true, std::nullopt), options);
    text += fmt::format("          \"{}\" -> \"{}\"\n", prompt, tok.decode(r.tokens));
  }
  return text;
}

// Where this program is (for the closing hint's PATH): the directory of /proc/self/exe, or
// build/bin where the link cannot be read.
std::string program_directory() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("$PWD/build/bin") : self.parent_path().string();
}

}  // namespace

void declare_demo_options(po::options_description& options,
                          po::positional_options_description& /*positional*/) {
  options.add_options()(
      "workdir", po::value<std::string>()->default_value("llama3-hpc-demo"),
      "where the demo writes its data, checkpoints and metrics (a new directory, or an earlier "
      "demo's: replaced; any other is refused)")(
      "model", po::value<std::string>()->default_value("tiny")->value_name("PRESET|config.json"),
      "the model to train from random weights")(
      "sft-steps",
      core::number<std::int64_t>(core::between(1, 1e9))->default_value(300)->value_name("N"),
      "SFT optimizer steps")(
      "reward-steps",
      core::number<std::int64_t>(core::between(1, 1e9))->default_value(400)->value_name("N"),
      "reward-model optimizer steps")(
      "dpo-steps",
      core::number<std::int64_t>(core::between(0, 1e9))->default_value(100)->value_name("N"),
      "DPO optimizer steps of the policy on the same pairs (0: no DPO stage)")(
      "grpo-steps",
      core::number<std::int64_t>(core::between(0, 1e9))->default_value(40)->value_name("N"),
      "GRPO steps of the SFT policy on prompts with exact answers (0: no GRPO stage)")(
      "lora", po::bool_switch(),
      "train the reward model (and the DPO policy) as LoRA adapters (rank 8 on every projection) "
      "on the frozen SFT model, and write the reward model's as a PEFT adapter directory");
}

int run_demo(const CommandContext& context) {
  const core::Stopwatch watch;
  const dist::World& world = context.world;
  const std::string root =
      core::output_directory("--workdir", context.options["workdir"].as<std::string>()).string();
  context.log.info("demo: {} rank{}, working in {}", world.size(), world.size() == 1 ? "" : "s",
                   root);
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      // The demo replaces what an earlier demo wrote there, and nothing else: a directory that
      // holds anything the demo does not write, or lacks its marker, is left alone (exit 2).
      if (core::entry_exists(root)) {
        if (const std::string why = why_not_demo(root); !why.empty()) {
          throw core::bad_input(
              fmt::format("--workdir names a directory that is not a llama3-hpc demo directory, "
                          "so it is left as it is: {}",
                          why),
              {.file = root});
        }
      }
      fs::create_directories(fs::path(root) / kInputDir);
      core::write_file_atomically((fs::path(root) / kMarker).string(), kMarkerText);
      // What the runs below write anew (the datasets are replaced by prep --overwrite).
      core::remove_tree(fs::path(root) / kCheckpoints);
      core::remove_tree(fs::path(root) / kRewardAdapter);
      core::remove_tree(fs::path(root) / kTensorBoard);
      core::remove_tree(fs::path(root) / kReport);
      for (const l3::Phase phase : kDemoPhases)
        core::remove_tree(fs::path(root) / metrics_file_name(phase));
      write_demo_sft((fs::path(root) / kInputDir / "instructions.jsonl").string(), kRecords);
      write_demo_preferences((fs::path(root) / kInputDir / "preferences.jsonl").string(), kRecords);
      write_demo_prompts((fs::path(root) / kInputDir / "prompts.jsonl").string(), kPromptRecords);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);

  const fs::path input = fs::path(root) / kInputDir;
  prepare(context, prep::DatasetKind::sft, (input / "instructions.jsonl").string(),
          (fs::path(root) / kSftData).string());
  prepare(context, prep::DatasetKind::preference, (input / "preferences.jsonl").string(),
          (fs::path(root) / kPairData).string());
  const bool with_grpo = context.options["grpo-steps"].as<std::int64_t>() > 0;
  if (with_grpo) {
    prepare(context, prep::DatasetKind::prompts, (input / "prompts.jsonl").string(),
            (fs::path(root) / kPromptData).string());
  }

  log_blas_core(context, "cpu");  // the demo's runs are --backend cpu
  context.log.info("demo: supervised fine-tuning");
  l3::RunSummary sft;
  {
    l3::Session session(world.comm(), demo_config(context, l3::Phase::sft, root));
    sft = session.run();
  }
  const bool lora = context.options["lora"].as<bool>();
  context.log.info(
      "demo: reward model, from the SFT checkpoint{}",
      lora ? fmt::format(" (LoRA adapters of rank {}, the SFT model frozen)", kDemoLoraRank) : "");
  l3::RunSummary reward;
  {
    l3::Session session(world.comm(), demo_config(context, l3::Phase::reward, root));
    reward = session.run();
  }
  const bool with_dpo = context.options["dpo-steps"].as<std::int64_t>() > 0;
  l3::RunSummary dpo;
  if (with_dpo) {
    context.log.info("demo: DPO of the SFT model on the same pairs{}",
                     lora ? " (LoRA adapters; the frozen SFT model is the reference)"
                          : " (the SFT model is the reference)");
    l3::Session session(world.comm(), demo_config(context, l3::Phase::dpo, root));
    dpo = session.run();
  }

  // GRPO: the exact-answer accuracy of greedy completions on held-out prompts, before the first
  // step (an evaluation at step 0) and after the last.
  l3::RunSummary grpo;
  std::optional<l3::EvalMetrics> grpo_before;
  if (with_grpo) {
    context.log.info(
        "demo: GRPO of the SFT model on prompts with exact answers ({} completions "
        "of each, rewarded 1 for the answer)",
        kGrpoGenerations);
    l3::Session session(world.comm(), demo_config(context, l3::Phase::grpo, root));
    grpo_before = session.evaluate();
    grpo = session.run();
  }

  if (world.is_root()) {
    const std::string samples = generation_samples(sft.checkpoint, context.log);
    std::string lora_note;
    if (lora) {
      const std::string adapter = (fs::path(root) / kRewardAdapter).string();
      context.log.info("demo: {}", export_lora_adapter(reward.checkpoint, adapter, false, true));
      lora_note = fmt::format(
          "\n          (LoRA: {:.2f} MB beside the SFT checkpoint's {:.2f} MB; as a PEFT adapter "
          "in {})",
          static_cast<double>(directory_bytes(reward.checkpoint)) / 1e6,
          static_cast<double>(directory_bytes(sft.checkpoint)) / 1e6, adapter);
    }
    // The curves of the three runs, one page (llama3-hpc report on the workdir).
    const std::vector<std::string> runs{root};
    const std::string report = (fs::path(root) / kReport).string();
    (void)report::write_report(runs, report);
    const l3::EvalMetrics& s = *sft.last_eval;
    const l3::EvalMetrics& r = *reward.last_eval;
    std::string dpo_line;
    if (with_dpo && dpo.last_eval) {
      const l3::EvalMetrics& d = *dpo.last_eval;
      dpo_line = fmt::format(
          "  DPO     {}: validation reward accuracy {:.1f}% (margin {:.2f}; chosen {:.2f}, "
          "rejected {:.2f}; loss {:.3f}, log 2 at the start) on {} pairs\n"
          "          checkpoint {}\n",
          core::count_of(dpo.steps, "step"), 100.0 * d.accuracy, d.margin, d.chosen_reward,
          d.rejected_reward, d.loss, d.pairs, dpo.checkpoint);
    }
    std::string grpo_line;
    if (with_grpo && grpo_before && grpo.last_eval) {
      const auto value = [](const l3::EvalMetrics& m, std::string_view name) {
        for (const auto& [key, v] : m.extra)
          if (key == name) return v;
        return 0.0;
      };
      grpo_line = fmt::format(
          "  GRPO    {}: exact answers of greedy completions on {:.0f} held-out prompts {:.1f}% -> "
          "{:.1f}% (sampled: {:.1f}% -> {:.1f}%)\n"
          "          checkpoint {}\n",
          core::count_of(grpo.steps, "step"), value(*grpo.last_eval, "prompts"),
          100.0 * value(*grpo_before, "reward"), 100.0 * value(*grpo.last_eval, "reward"),
          100.0 * value(*grpo_before, "reward_sampled"),
          100.0 * value(*grpo.last_eval, "reward_sampled"), grpo.checkpoint);
    }
    std::cout << fmt::format(
        "\nllama3-hpc demo: done in {} on {} rank{}\n"
        "  SFT     {}: validation loss {:.3f} (perplexity {:.2f}) on {} answer tokens\n"
        "          checkpoint {}, which answers:\n{}"
        "  reward  {}: validation accuracy {:.1f}% (mean margin {:.2f}) on {} pairs\n"
        "          checkpoint {}{}\n"
        "{}{}"
        "  the curves: {} (open it in a browser)\n"
        "  data, metrics (metrics-*.jsonl), TensorBoard's files (tensorboard/) and checkpoints "
        "are in {}\n\n"
        "Next, README.md's commands (\"Using it\"), as written: on the demo's records until you\n"
        "have your own (JSONL as in docs/FORMAT.md), with a pretrained model M if there is one\n"
        "(huggingface-cli download meta-llama/Llama-3.2-1B-Instruct --local-dir "
        "Llama-3.2-1B-Instruct),\nelse tiny-llama3 (Llama 3's vocabulary, random weights) and "
        "the byte tokenizer:\n"
        "  export PATH={}:$PATH\n"
        "  D={}/{}\n"
        "  M=Llama-3.2-1B-Instruct\n"
        "  FROM=\"--init $M\" TOK=$M\n"
        "  [ -d \"$M\" ] || {{ FROM=\"--model tiny-llama3\" TOK=bytes; }}\n"
        "  SEQ=256 BATCH=8 STEPS=20            # a laptop's; on GPUs: SEQ=2048 BATCH=64 "
        "STEPS=1000\n"
        "  llama3-hpc prep sft --input $D/instructions.jsonl --tokenizer $TOK --output sft "
        "--val-fraction 0.05\n"
        "  mpiexec -n 2 llama3-hpc sft $FROM --data sft/train --val-data sft/val --seq-len $SEQ "
        "\\\n      --global-batch $BATCH --steps $STEPS --lr 2e-5 --metrics sft.jsonl "
        "--ckpt-dir ckpt/sft\n"
        "  llama3-hpc prep preference --input $D/preferences.jsonl --tokenizer $TOK --output "
        "pairs --val-fraction 0.05\n"
        "  mpiexec -n 2 llama3-hpc reward --init ckpt/sft --data pairs/train --val-data "
        "pairs/val \\\n      --seq-len $SEQ --global-batch $BATCH --steps $STEPS --metrics "
        "rm.jsonl --ckpt-dir ckpt/rm\n"
        "  mpiexec -n 2 llama3-hpc dpo --init ckpt/sft --data pairs/train --val-data pairs/val "
        "\\\n      --seq-len $SEQ --global-batch $BATCH --steps $STEPS --lr 5e-7 --metrics "
        "dpo.jsonl --ckpt-dir ckpt/dpo\n"
        "  llama3-hpc prep prompts --input $D/prompts.jsonl --tokenizer $TOK --output prompts "
        "--val-fraction 0.05\n"
        "  mpiexec -n 2 llama3-hpc grpo --init ckpt/sft --data prompts/train --val-data "
        "prompts/val \\\n      --reward-match answer --seq-len $SEQ --global-batch 8 "
        "--num-generations 8 \\\n      --max-completion-length 64 --steps $STEPS --lr 1e-6 "
        "--metrics grpo.jsonl --ckpt-dir ckpt/grpo\n"
        "  llama3-hpc eval --init ckpt/grpo --data prompts/val\n"
        "  llama3-hpc generate --init ckpt/grpo --input $D/prompts.jsonl --output "
        "completions.jsonl --max-new 64\n"
        "  llama3-hpc export --ckpt ckpt/dpo --output hf/dpo\n"
        "  llama3-hpc report sft.jsonl rm.jsonl dpo.jsonl grpo.jsonl --output report.html\n"
        "See docs/TRAINING.md for every option.\n",
        train::format_duration(watch.seconds()), world.size(), world.size() == 1 ? "" : "s",
        core::count_of(sft.steps, "step"), s.loss, s.perplexity, s.tokens, sft.checkpoint, samples,
        core::count_of(reward.steps, "step"), 100.0 * r.accuracy, r.margin, r.pairs,
        reward.checkpoint, lora_note, dpo_line, grpo_line, report, root, program_directory(), root,
        kInputDir);
  }
  return core::kExitOk;
}

}  // namespace l3::cli
