// The C API (include/l3/l3.h) over the C++ one: opaque handles own C++ objects, every entry
// point catches everything and turns it into a status code plus this thread's message.
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "l3/l3.h"
#include "l3/l3.hpp"

struct l3_config {
  l3::RunConfig config;
  std::string shown;  // l3_config_get's last answer
};

struct l3_session {
  std::unique_ptr<l3::Session> session;
  std::string directory;  // l3_session_checkpoint's last answer
};

struct l3_batch {
  l3::StepSamples* samples = nullptr;
  std::string failure;
};

namespace {

thread_local std::string
    t_last_error;  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

int fail(int code, std::string message) {
  t_last_error = std::move(message);
  return code;
}

// Runs `body`, returning L3_OK or the failure's code with its message kept for l3_last_error().
template <typename Body>
int guarded(Body&& body) noexcept {
  try {
    body();
    return L3_OK;
  } catch (const l3::Error& e) {
    return fail(e.exit_code() == 2 ? L3_ERROR_INPUT : L3_ERROR_INTERNAL, e.what());
  } catch (...) {
    const l3::core::ErrorSummary summary = l3::core::summarize(std::current_exception());
    return fail(summary.exit_code == 2 ? L3_ERROR_INPUT : L3_ERROR_INTERNAL, summary.text);
  }
}

int null_argument(const char* function, const char* argument) {
  return fail(L3_ERROR_INPUT, std::string(function) + ": " + argument + " is NULL");
}

// A phase's own metric by name (GRPO's), NaN when it has none.
double extra_value(const std::vector<std::pair<std::string, double>>& extra,
                   std::string_view name) {
  for (const auto& [key, value] : extra)
    if (key == name) return value;
  return kNaN;
}

l3_step_metrics to_c(const l3::StepMetrics& m) {
  return {.step = m.step,
          .total_steps = m.total_steps,
          .loss = m.loss,
          .lr = m.lr,
          .grad_norm = m.grad_norm,
          .tokens = m.tokens,
          .tokens_per_s = m.tokens_per_s,
          .mfu = m.mfu.value_or(kNaN),
          .accuracy = m.accuracy.value_or(kNaN),
          .margin = m.margin.value_or(kNaN),
          .step_ms = m.step_ms,
          .data_wait_ms = m.data_wait_ms,
          .skipped = m.skipped ? 1 : 0,
          .reward = extra_value(m.extra, "reward")};
}

l3_eval_metrics to_c(const l3::EvalMetrics& m) {
  const bool sft = m.phase == l3::Phase::sft;
  const bool grpo = m.phase == l3::Phase::grpo;
  return {.step = m.step,
          .loss = sft || m.phase == l3::Phase::dpo ? m.loss : kNaN,
          .perplexity = sft ? m.perplexity : kNaN,
          .accuracy = sft || grpo ? kNaN : m.accuracy,
          .margin = sft || grpo ? kNaN : m.margin,
          .samples = sft    ? m.tokens
                     : grpo ? static_cast<std::int64_t>(extra_value(m.extra, "prompts"))
                            : m.pairs,
          .reward = grpo ? extra_value(m.extra, "reward") : kNaN};
}

// A DataSource calling the C host's function.
class CallbackSource final : public l3::DataSource {
 public:
  CallbackSource(l3_fill_callback callback, void* user) : fill_(callback), user_(user) {}
  void fill(std::int64_t step, int rank, int ranks, l3::StepSamples& out) override {
    l3_batch batch{.samples = &out, .failure = {}};
    if (fill_(step, rank, ranks, &batch, user_) != 0) {
      throw l3::core::bad_input(batch.failure.empty()
                                    ? "the host's fill callback failed (returned non-zero)"
                                    : "the host's fill callback failed: " + batch.failure);
    }
  }

 private:
  l3_fill_callback fill_;
  void* user_;
};

int create_session(MPI_Comm comm, const l3_config* config, std::shared_ptr<l3::DataSource> source,
                   l3_session** out) {
  if (config == nullptr) return null_argument("l3_session_create", "config");
  if (out == nullptr) return null_argument("l3_session_create", "out");
  *out = nullptr;
  return guarded([&] {
    auto handle = std::make_unique<l3_session>();
    handle->session = std::make_unique<l3::Session>(comm, config->config, std::move(source));
    *out = handle.release();
  });
}

}  // namespace

extern "C" {

const char* l3_version(void) {
  static const std::string version = l3::version();
  return version.c_str();
}

const char* l3_last_error(void) { return t_last_error.c_str(); }

int l3_config_from_args(int argc, const char* const* argv, l3_config** out) {
  if (out == nullptr) return null_argument("l3_config_from_args", "out");
  *out = nullptr;
  if (argv == nullptr && argc > 0) return null_argument("l3_config_from_args", "argv");
  return guarded([&] {
    std::vector<std::string> args;
    for (int i = 0; i < argc; ++i) {
      if (argv[i] == nullptr)
        throw l3::core::usage_error("l3_config_from_args: an argument is NULL");
      args.emplace_back(argv[i]);
    }
    auto made = std::make_unique<l3_config>(l3_config{l3::RunConfig::from_args(args), {}});
    *out = made.release();  // the caller's until l3_config_free
  });
}

int l3_config_from_file(const char* path, const char* phase, l3_config** out) {
  if (out == nullptr) return null_argument("l3_config_from_file", "out");
  *out = nullptr;
  if (path == nullptr) return null_argument("l3_config_from_file", "path");
  if (phase == nullptr) return null_argument("l3_config_from_file", "phase");
  const char* const argv[] = {phase, "--config", path};
  return l3_config_from_args(3, argv, out);
}

int l3_config_set(l3_config* config, const char* option, const char* value) {
  if (config == nullptr) return null_argument("l3_config_set", "config");
  if (option == nullptr) return null_argument("l3_config_set", "option");
  if (value == nullptr) return null_argument("l3_config_set", "value");
  return guarded([&] { config->config.set(option, std::string_view(value)); });
}

const char* l3_config_get(l3_config* config, const char* option) {
  if (config == nullptr || option == nullptr) {
    (void)null_argument("l3_config_get", config == nullptr ? "config" : "option");
    return nullptr;
  }
  const int status = guarded([&] { config->shown = config->config.get(option); });
  return status == L3_OK ? config->shown.c_str() : nullptr;
}

void l3_config_free(l3_config* config) { const std::unique_ptr<l3_config> owned(config); }

int l3_session_create(MPI_Comm comm, const l3_config* config, l3_session** out) {
  return create_session(comm, config, nullptr, out);
}

int l3_session_create_with_data(MPI_Comm comm, const l3_config* config, l3_fill_callback fill,
                                void* user, l3_session** out) {
  return create_session(
      comm, config, fill != nullptr ? std::make_shared<CallbackSource>(fill, user) : nullptr, out);
}

int l3_session_create_f(MPI_Fint comm, const l3_config* config, l3_session** out) {
  return create_session(MPI_Comm_f2c(comm), config, nullptr, out);
}

void l3_session_free(l3_session* session) { const std::unique_ptr<l3_session> owned(session); }

int l3_session_run(l3_session* session, l3_run_summary* summary) {
  if (session == nullptr) return null_argument("l3_session_run", "session");
  return guarded([&] {
    const l3::RunSummary s = session->session->run();
    if (summary != nullptr) {
      *summary = {.steps = s.steps,
                  .first_step = s.first_step,
                  .stopped = s.stopped ? 1 : 0,
                  .skipped_steps = s.skipped_steps,
                  .final_loss = s.last_step ? s.last_step->loss : kNaN,
                  .seconds = s.seconds,
                  .tokens_per_s = s.tokens_per_s};
    }
  });
}

int l3_session_step(l3_session* session, int* more) {
  if (session == nullptr) return null_argument("l3_session_step", "session");
  return guarded([&] {
    const bool stepped = session->session->step();
    if (more != nullptr) *more = stepped ? 1 : 0;
  });
}

int l3_session_evaluate(l3_session* session, l3_eval_metrics* metrics, int* evaluated) {
  if (session == nullptr) return null_argument("l3_session_evaluate", "session");
  return guarded([&] {
    const std::optional<l3::EvalMetrics> m = session->session->evaluate();
    if (evaluated != nullptr) *evaluated = m ? 1 : 0;
    if (m && metrics != nullptr) *metrics = to_c(*m);
  });
}

int l3_session_checkpoint(l3_session* session, l3_checkpoint_info* info) {
  if (session == nullptr) return null_argument("l3_session_checkpoint", "session");
  return guarded([&] {
    const l3::CheckpointInfo c = session->session->checkpoint();
    session->directory = c.directory;
    if (info != nullptr) {
      *info = {.step = c.step,
               .directory = session->directory.c_str(),
               .bytes = c.bytes,
               .seconds = c.seconds};
    }
  });
}

void l3_session_request_checkpoint(l3_session* session) {
  if (session != nullptr) session->session->request_checkpoint();
}

void l3_session_request_stop(l3_session* session) {
  if (session != nullptr) session->session->request_stop();
}

int l3_session_on_step(l3_session* session, l3_step_callback callback, void* user) {
  if (session == nullptr) return null_argument("l3_session_on_step", "session");
  if (callback == nullptr) return null_argument("l3_session_on_step", "callback");
  return guarded([&] {
    session->session->on_step([callback, user](const l3::StepMetrics& m) {
      const l3_step_metrics c = to_c(m);
      callback(&c, user);
    });
  });
}

int l3_session_on_eval(l3_session* session, l3_eval_callback callback, void* user) {
  if (session == nullptr) return null_argument("l3_session_on_eval", "session");
  if (callback == nullptr) return null_argument("l3_session_on_eval", "callback");
  return guarded([&] {
    session->session->on_eval([callback, user](const l3::EvalMetrics& m) {
      const l3_eval_metrics c = to_c(m);
      callback(&c, user);
    });
  });
}

int l3_session_on_checkpoint(l3_session* session, l3_checkpoint_callback callback, void* user) {
  if (session == nullptr) return null_argument("l3_session_on_checkpoint", "session");
  if (callback == nullptr) return null_argument("l3_session_on_checkpoint", "callback");
  return guarded([&] {
    session->session->on_checkpoint([callback, user](const l3::CheckpointInfo& info) {
      const l3_checkpoint_info c{.step = info.step,
                                 .directory = info.directory.c_str(),
                                 .bytes = info.bytes,
                                 .seconds = info.seconds};
      callback(&c, user);
    });
  });
}

int64_t l3_session_steps_done(const l3_session* session) {
  return session != nullptr ? session->session->steps_done() : 0;
}

int64_t l3_session_total_steps(const l3_session* session) {
  return session != nullptr ? session->session->total_steps() : 0;
}

int l3_batch_add_document(l3_batch* batch, const int32_t* tokens, const uint8_t* loss_mask,
                          size_t length) {
  if (batch == nullptr) return null_argument("l3_batch_add_document", "batch");
  if ((tokens == nullptr || loss_mask == nullptr) && length > 0)
    return null_argument("l3_batch_add_document", tokens == nullptr ? "tokens" : "loss_mask");
  return guarded([&] {
    batch->samples->documents.push_back({std::vector<std::int32_t>(tokens, tokens + length),
                                         std::vector<std::uint8_t>(loss_mask, loss_mask + length)});
  });
}

int l3_batch_add_pair(l3_batch* batch, const int32_t* chosen, size_t chosen_length,
                      const int32_t* rejected, size_t rejected_length, float margin) {
  if (batch == nullptr) return null_argument("l3_batch_add_pair", "batch");
  if ((chosen == nullptr && chosen_length > 0) || (rejected == nullptr && rejected_length > 0))
    return null_argument("l3_batch_add_pair", chosen == nullptr ? "chosen" : "rejected");
  return guarded([&] {
    batch->samples->pairs.push_back(
        {std::vector<std::int32_t>(chosen, chosen + chosen_length),
         std::vector<std::int32_t>(rejected, rejected + rejected_length), margin});
  });
}

void l3_batch_fail(l3_batch* batch, const char* message) {
  if (batch != nullptr && message != nullptr) batch->failure = message;
}

}  // extern "C"
