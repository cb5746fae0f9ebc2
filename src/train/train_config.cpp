#include "train/train_config.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "kernels/backend_options.hpp"
#include "parallel/placement_choice.hpp"

namespace l3::train {

void TrainConfig::validate() const {
  // Each option's own domain (positive sizes, finite rates, ...) is checked where options are
  // parsed (core/option_domain.hpp); what is left are the rules between options.
  auto require = [](bool ok, std::string_view message) {
    if (!ok) throw core::usage_error(std::string(message));
  };
  require(!data.empty() || data_from_host,
          "--data is required (a dataset directory made by 'llama3-hpc prep')");
  require(!data_from_host || (steps > 0 && epochs == 0),
          "--data is required (a dataset directory made by 'llama3-hpc prep'); a host "
          "embedding the library may give a DataSource instead, with --steps");
  require(!model.empty() || !init.empty(),
          "say which model: --model PRESET|config.json, or --init CHECKPOINT");
  require(global_batch > 0, "--global-batch is required and must be positive");
  require(!(steps > 0 && epochs > 0), "give --steps or --epochs, not both");
  require(checkpoint_every == 0 || !ckpt_dir.empty(), "--checkpoint-every needs --ckpt-dir");
  require(ckpt_local.empty() || !ckpt_dir.empty(),
          "--ckpt-local needs --ckpt-dir (where the node-local level is flushed, and the final "
          "checkpoint goes)");
  require(ckpt_local.empty() == (checkpoint_every_local == 0),
          "--ckpt-local and --checkpoint-every-local go together (where and how often)");
  require(resume.mode != ckpt::ResumeMode::path || !resume.path.empty(),
          "--resume takes auto, none or a checkpoint path");
  require(resume.mode != ckpt::ResumeMode::path || !ckpt_dir.empty(),
          "--resume CKPT needs --ckpt-dir (where the resumed run writes its checkpoints)");
  // (--attention's other rules, and this one again, in kernels::choose_attention)
  require(!(deterministic && attention == kernels::Attention::cudnn_nondeterministic),
          "--attention cudnn-nondeterministic gives up the bit-identical results that "
          "--deterministic asks for: drop one of them (--attention auto is deterministic)");
  lora.validate();
  parallel::check_sharding_options(*this);
  require(init_adapter.empty() || lora.enabled(),
          "--init-adapter needs LoRA: --lora-rank R (the adapter's rank)");
  require(reference_dir.empty() || phase == Phase::dpo, "--reference-dir is for dpo runs");
  if (phase == Phase::grpo) {
    grpo.validate();
    require(data_from_host == false, "grpo reads its prompts from --data (made by 'prep prompts')");
    require(grpo.max_completion_length < seq_len,
            "--max-completion-length must leave room for a prompt in --seq-len");
    if (grpo.generation_ranks > 0 && global_batch % grpo.generation_ranks != 0) {
      throw core::usage_error(fmt::format(
          "--global-batch {} (prompts per step) must be a multiple of --generation-ranks {}: a "
          "prompt's completions are generated on one rank",
          global_batch, grpo.generation_ranks));
    }
  }
}

ExchangeChoice parse_exchange_choice(std::string_view name) {
  if (name == "auto") return ExchangeChoice::automatic;
  if (name == "mpi") return ExchangeChoice::mpi;
  if (name == "nccl") return ExchangeChoice::nccl;
  if (name == "mpi-staged") return ExchangeChoice::mpi_staged;  // for tests; not advertised
  throw core::usage_error("--grad-exchange takes auto, mpi or nccl");
}

ProgressMode parse_progress_mode(std::string_view name) {
  if (name == "auto") return ProgressMode::automatic;
  if (name == "always") return ProgressMode::always;
  if (name == "never") return ProgressMode::never;
  throw core::usage_error(fmt::format("--progress {}: takes auto, always or never", name));
}

std::string_view exchange_choice_name(ExchangeChoice choice) noexcept {
  switch (choice) {
    case ExchangeChoice::mpi:
      return "mpi";
    case ExchangeChoice::nccl:
      return "nccl";
    case ExchangeChoice::mpi_staged:
      return "mpi-staged";
    case ExchangeChoice::automatic:
      break;
  }
  return "auto";
}

GradAccumDtype parse_grad_accum_dtype(std::string_view name) {
  if (name == "auto") return GradAccumDtype::automatic;
  if (name == "fp32") return GradAccumDtype::fp32;
  if (name == "bf16") return GradAccumDtype::bf16;
  throw core::usage_error("--grad-accum-dtype takes auto, fp32 or bf16");
}

std::string_view grad_accum_dtype_name(GradAccumDtype dtype) noexcept {
  switch (dtype) {
    case GradAccumDtype::fp32:
      return "fp32";
    case GradAccumDtype::bf16:
      return "bf16";
    case GradAccumDtype::automatic:
      break;
  }
  return "auto";
}

ckpt::ResumeChoice parse_resume_choice(std::string_view value) {
  if (value.empty()) throw core::usage_error("--resume takes auto, none or a checkpoint path");
  if (value == "auto") return {.mode = ckpt::ResumeMode::automatic, .path = {}};
  if (value == "none") return {.mode = ckpt::ResumeMode::none, .path = {}};
  return {.mode = ckpt::ResumeMode::path, .path = std::string(value)};
}

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json j = {{"phase", phase_name(phase)},
                      {"model", model},
                      {"init", init},
                      {"data", data_from_host ? std::string("(host DataSource)") : data},
                      {"val_data", val_data},
                      {"backend", kernels::backend_name(backend)},
                      {"seq_len", seq_len},
                      {"global_batch", global_batch},
                      {"micro_batch", micro_batch},
                      {"steps", steps},
                      {"epochs", epochs},
                      {"drop_long", drop_long},
                      {"lr", lr},
                      {"min_lr", min_lr < 0 ? 0.1 * lr : min_lr},
                      {"warmup", warmup},
                      {"beta1", adamw.beta1},
                      {"beta2", adamw.beta2},
                      {"eps", adamw.eps},
                      {"weight_decay", adamw.weight_decay},
                      {"grad_clip", grad_clip},
                      {"seed", seed},
                      {"recompute", recompute},
                      {"lora_rank", lora.rank},
                      {"lora_alpha", lora.alpha},
                      {"lora_rslora", lora.rslora},
                      {"lora_dropout", lora.dropout},
                      {"lora_targets", lora.targets_text()},
                      {"init_adapter", init_adapter},
                      {"margin_from_data", margin_from_data},
                      {"center_rewards", center_rewards},
                      {"shard_optimizer", shard_optimizer},
                      {"shard_gradients", shard_gradients},
                      {"shard_parameters", shard_parameters},
                      {"prefetch_gathers", prefetch_gathers},
                      {"shard_group_size", shard_group_size},
                      {"context_parallel", context_parallel},
                      {"tensor_parallel", tensor_parallel},
                      {"grad_accum_dtype", grad_accum_dtype_name(grad_accum_dtype)},
                      {"bucket_mb", bucket_mb},
                      {"overlap_reduction", overlap_reduction},
                      {"grad_exchange", exchange_choice_name(grad_exchange)},
                      {"deterministic", deterministic},
                      {"device", device},
                      {"attention", kernels::attention_name(attention)},
                      {"prefetch_depth", prefetch_depth},
                      {"eval_every", eval_every},
                      {"log_every", log_every},
                      {"metrics", metrics},
                      {"tensorboard", tensorboard},
                      {"ckpt_dir", ckpt_dir},
                      {"checkpoint_every", checkpoint_every},
                      {"ckpt_local", ckpt_local},
                      {"checkpoint_every_local", checkpoint_every_local},
                      {"ckpt_redundancy", ckpt::redundancy_name(ckpt_redundancy)},
                      {"flush_every", flush_every},
                      {"ckpt_xor_set", xor_set_size},
                      {"max_bad_steps", max_bad_steps},
                      {"keep_last", keep_last},
                      {"peak_tflops", peak_tflops}};
  if (phase == Phase::dpo) {
    j["beta"] = dpo.beta;
    j["label_smoothing"] = dpo.label_smoothing;
    j["loss"] = preference_loss_name(dpo.loss);
    j["reference_dir"] = reference_dir;
  }
  if (phase == Phase::grpo) {
    grpo.add_to(j);
    j["tokenizer"] = tokenizer;
  }
  return j;
}

kernels::PreferenceLoss parse_preference_loss(std::string_view name) {
  if (name == "sigmoid") return kernels::PreferenceLoss::sigmoid;
  if (name == "ipo") return kernels::PreferenceLoss::ipo;
  throw core::usage_error("--loss takes sigmoid or ipo");
}

std::string_view preference_loss_name(kernels::PreferenceLoss loss) noexcept {
  return loss == kernels::PreferenceLoss::ipo ? "ipo" : "sigmoid";
}

}  // namespace l3::train
