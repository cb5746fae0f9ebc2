// l3::Session: a training run on a host's communicator, over train::Trainer. The session owns
// its World (a private duplicate of the host's communicator), its logger and its trainer, and
// nothing global: sessions on disjoint communicators run side by side in one job.
#include <fmt/format.h>

#include "api/host_data.hpp"
#include "api/public_errors.hpp"
#include "api/run_config_parsed.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "dist/thread_budget.hpp"
#include "dist/world.hpp"
#include "l3/l3.hpp"
#include "train/grpo/generation_worker.hpp"
#include "train/trainer.hpp"

namespace l3 {

Error::Error(int exit_code, const std::string& message, bool from_another_rank)
    : std::runtime_error(message), exit_code_(exit_code), from_another_rank_(from_another_rank) {}

std::string version() { return core::build_info().version; }

namespace {

train::TrainConfig with_host_data(train::TrainConfig config, bool from_host) {
  config.data_from_host = from_host;
  if (from_host) config.data.clear();
  return config;
}

}  // namespace

struct Session::Impl {
  // `train` already says whether the data comes from the host (with_host_data).
  Impl(MPI_Comm comm, const RunConfig::Parsed& parsed, train::TrainConfig train,
       std::unique_ptr<train::StepSource> host_data, const std::atomic<bool>* stop)
      : world(comm),
        log(world.rank(), world.size(), parsed.log),
        threads(dist::apply_thread_budget(world)) {
    if (train.phase != Phase::grpo || train.grpo.generation_ranks == 0) {
      trainer = std::make_unique<train::Trainer>(world, log, std::move(train), std::move(host_data),
                                                 stop);
      return;
    }
    // Asynchronous GRPO: the last ranks generate, the others train (train/grpo/generation_link).
    split = train::grpo::split_for_generation(world, train.grpo.generation_ranks);
    if (split.link->generating()) {
      worker = std::make_unique<train::grpo::GenerationWorker>(world, *split.link, *split.group,
                                                               log, train);
      return;
    }
    try {
      trainer = std::make_unique<train::Trainer>(*split.group, log, std::move(train),
                                                 std::move(host_data), stop, split.link.get());
    } catch (...) {
      // The generating ranks wait for their setup: they end with this error too.
      if (world.is_root()) {
        const core::ErrorSummary summary = core::summarize(std::current_exception());
        train::grpo::send_setup_failure(*split.link, summary.exit_code, summary.text);
      }
      throw;
    }
  }

  // A generating rank's whole part of the run (it has no steps of its own).
  RunSummary generate() {
    RunSummary out;
    if (!generated) out.stopped = worker->run();
    generated = true;
    return out;
  }

  dist::World world;
  core::Logger log;
  dist::ThreadBudget threads;
  train::grpo::SplitWorld split;  // asynchronous GRPO only
  std::unique_ptr<train::Trainer> trainer;
  std::unique_ptr<train::grpo::GenerationWorker> worker;  // a generating rank's, instead
  bool generated = false;
};

Session::Session(MPI_Comm comm, const RunConfig& config) : Session(comm, config, nullptr) {}

Session::Session(MPI_Comm comm, const RunConfig& config, std::shared_ptr<DataSource> data)
    : Session(comm, config, std::move(data), nullptr) {}

Session::Session(MPI_Comm comm, const RunConfig& config, std::shared_ptr<DataSource> data,
                 const std::atomic<bool>* stop) {
  api::rethrow_as_public([&] {
    std::unique_ptr<train::StepSource> host_data;
    if (data) host_data = api::host_step_source(std::move(data));
    train::TrainConfig train = with_host_data(config.parsed_->train, host_data != nullptr);
    impl_ =
        std::make_unique<Impl>(comm, *config.parsed_, std::move(train), std::move(host_data), stop);
  });
}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

RunSummary Session::run() {
  RunSummary out;
  api::rethrow_as_public([&] { out = impl_->worker ? impl_->generate() : impl_->trainer->run(); });
  return out;
}

bool Session::step() {
  bool more = false;
  api::rethrow_as_public([&] {
    if (impl_->worker) {
      (void)impl_->generate();  // the generating ranks' part ends with the run
    } else {
      more = impl_->trainer->step();
    }
  });
  return more;
}

std::optional<EvalMetrics> Session::evaluate() {
  std::optional<EvalMetrics> out;
  api::rethrow_as_public([&] {
    if (impl_->trainer) out = impl_->trainer->evaluate();
  });
  return out;
}

CheckpointInfo Session::checkpoint() {
  CheckpointInfo out;
  api::rethrow_as_public([&] {
    if (impl_->trainer) out = impl_->trainer->checkpoint();
  });
  return out;
}

void Session::request_checkpoint() noexcept {
  if (impl_->trainer) impl_->trainer->request_checkpoint();
}
void Session::request_stop() noexcept {
  if (impl_->trainer) impl_->trainer->request_stop();
}

void Session::on_step(std::function<void(const StepMetrics&)> callback) {
  if (impl_->trainer) impl_->trainer->on_step(std::move(callback));
}
void Session::on_eval(std::function<void(const EvalMetrics&)> callback) {
  if (impl_->trainer) impl_->trainer->on_eval(std::move(callback));
}
void Session::on_checkpoint(std::function<void(const CheckpointInfo&)> callback) {
  if (impl_->trainer) impl_->trainer->on_checkpoint(std::move(callback));
}

std::int64_t Session::steps_done() const noexcept {
  return impl_->trainer ? impl_->trainer->steps_done() : 0;
}
std::int64_t Session::total_steps() const noexcept {
  return impl_->trainer ? impl_->trainer->total_steps() : 0;
}
int Session::rank() const noexcept { return impl_->world.rank(); }
int Session::size() const noexcept { return impl_->world.size(); }

}  // namespace l3
