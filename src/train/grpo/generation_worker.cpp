#include "train/grpo/generation_worker.hpp"

#include <fmt/format.h>

#include <array>
#include <deque>
#include <exception>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/timer.hpp"
#include "dist/collectives.hpp"
#include "kernels/backends.hpp"

namespace l3::train::grpo {

using nlohmann::json;

namespace {

// Rethrows a failure the training ranks reported, as an Error of its exit code.
[[noreturn]] void rethrow_reported(const json& message) {
  const std::string text = message.at("error").get<std::string>();
  const int code = message.value("exit_code", core::kExitInternal);
  if (code == core::kExitBadInput) throw core::bad_input(text);
  if (code == core::kExitCheckpointed) throw core::stopped_before_start(text);
  throw core::internal_error(text);
}

}  // namespace

void send_setup_failure(const GenerationLink& link, int exit_code, const std::string& message) {
  const std::string text = json{{"error", message}, {"exit_code", exit_code}}.dump();
  for (int g = 0; g < link.generators; ++g)
    send_text(link.comm.get(), text, link.first_generator() + g, kSetupTag);
}

GenerationWorker::GenerationWorker(const dist::World& world, const GenerationLink& link,
                                   const dist::World& group, const core::Logger& log,
                                   const TrainConfig& config)
    : link_(link), group_(group), log_(log) {
  const MPI_Comm comm = link.comm.get();
  const json setup = json::parse(receive_text(comm, 0, kSetupTag));
  if (setup.contains("error")) rethrow_reported(setup);
  const model::ModelConfig mc =
      model::from_hf_config(setup.at("model"), "the training ranks' model");
  ops_ = kernels::make_ops(config.backend, world.local_rank(),
                           {.device = config.device,
                            .attention = config.attention,
                            .deterministic = config.deterministic});
  // The policy whole on this rank, forward only; with LoRA its adapters over the frozen base.
  model_ = build_model(*ops_, mc,
                       ModelRecipe{.purpose = ModelPurpose::generate,
                                   .head = model::HeadKind::language_model,
                                   .placement = model::Placement::frozen(false, 1),
                                   .recompute = true,
                                   .lora = config.lora,
                                   .seed = config.seed});
  model::LlamaModel& model = *model_.model;
  if (model.has_adapters()) {
    // The frozen base: every training rank's pieces (generation_link.hpp).
    std::vector<float> base(static_cast<std::size_t>(model.layout().total()));
    for (int r = 0; r < link.trainers; ++r) (void)receive_pieces(comm, r, base);
    model.load_parameters(base);
  }
  PromptSet prompts;
  prompts.share(comm, 0);
  RolloutConfig rollout{.settings = config.grpo,
                        .seed = config.seed,
                        .prompts_per_step = config.global_batch,
                        .micro_batch = config.micro_batch,
                        .seq_len = config.seq_len,
                        .shard_parameters = false,
                        .tokenizer = setup.at("tokenizer").get<std::string>(),
                        .cache_dir = {},
                        .stop = nullptr,
                        .link = &link,
                        .generate = true};
  source_ = std::make_unique<RolloutSource>(group, log, model, ReferencePolicy{},
                                            std::move(prompts), PromptSet(), std::move(rollout));
  receiver_ = std::make_unique<VersionReceiver>(
      link, model.trainable_layout().total(),
      wire_type_from(setup.value("weights_dtype", std::string("f32"))),
      world.thread_level() == MPI_THREAD_MULTIPLE);
}

GenerationWorker::~GenerationWorker() = default;

bool GenerationWorker::run() {
  const MPI_Comm comm = link_.comm.get();
  ops_->bind_thread();
  model::LlamaModel& model = *model_.model;
  // The batches on their way to training rank 0 (nonblocking: with S >= 2 this rank may make the
  // next one before the last is taken).
  std::deque<std::unique_ptr<VersionSends>> sending;
  const std::array<int, 1> trainer0{0};
  for (;;) {
    while (!sending.empty() && sending.front()->done()) sending.pop_front();
    const core::Stopwatch idle;
    const VersionReceiver::Version received = receiver_->take();
    const json control = json::parse(received.control);
    if (received.stop) {
      for (const auto& s : sending) s->complete();  // taken before the stop was sent
      const bool stopped = control.at("stopped").get<bool>();
      if (!stopped) source_->finish();  // the verifier's last words
      return stopped;
    }
    // Received on the receiver's thread, the transfer overlapped the last batches' generation;
    // received here, it is part of this rank's time on the weights.
    const double inline_transfer_ms = receiver_->background() ? 0.0 : received.transfer_ms;
    const double idle_ms = idle.milliseconds() - inline_transfer_ms;
    const core::Stopwatch watch;
    if (model.has_adapters()) {
      model.load_adapters(received.weights);
    } else {
      model.load_parameters(received.weights);
    }
    receiver_->release();
    const double weights_ms = watch.milliseconds() + inline_transfer_ms;
    const auto version = control.at("version").get<std::int64_t>();
    bool first = true;
    for (const json& j : control.at("batches")) {
      const auto step = j.get<std::int64_t>();
      std::string text;
      std::exception_ptr failure;
      try {
        text = source_->make_batch(step,
                                   {{"generation/idle_ms", first ? idle_ms : 0.0},
                                    {"generation/weights_ms", first ? weights_ms : 0.0},
                                    {"generation/transfer_ms", first ? received.transfer_ms : 0.0},
                                    {"generation/policy_version", static_cast<double>(version)}});
      } catch (...) {
        failure = std::current_exception();
      }
      first = false;
      if (failure) {
        if (group_.is_root()) {
          const core::ErrorSummary summary = core::summarize(failure);
          send_text(comm, json{{"error", summary.text}, {"exit_code", summary.exit_code}}.dump(), 0,
                    kBatchTag);
        }
        std::rethrow_exception(failure);
      }
      if (group_.is_root()) {
        sending.push_back(std::make_unique<VersionSends>(step));
        sending.back()->send_text(comm, std::move(text), trainer0, kBatchTag);
      }
    }
  }
}

}  // namespace l3::train::grpo
