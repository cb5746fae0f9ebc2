// llama3-hpc's public C++ API: fine-tune Llama 3 (SFT or a Bradley-Terry reward model) inside
// a host application's own MPI job, on the communicator it chooses. See docs/embedding.md.
//
//   l3::RunConfig config = l3::RunConfig::from_args({"sft", "--model", "tiny", "--data", "d",
//                                                    "--global-batch", "8", "--steps", "100"});
//   l3::Session session(comm, config);          // collective over comm
//   session.on_step([](const l3::StepMetrics& m) { ... });
//   l3::RunSummary summary = session.run();     // or: while (session.step()) { ... }
//
// Every Session call is collective over the session's communicator (all its ranks call it, in
// the same order) unless it says otherwise. The library never uses MPI_COMM_WORLD and keeps no
// global state: sessions on disjoint communicators run side by side, and a session can be
// destroyed and another created in the same process. Errors are thrown as l3::Error.
//
// MPI must be initialised by the host (MPI_THREAD_MULTIPLE is best: checkpoints are written by
// a background thread; with less, they are written on the training thread).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// What the shared library exports (it is built with hidden visibility: everything else stays
// inside).
#if defined(_WIN32)
#define L3_API
#else
#define L3_API __attribute__((visibility("default")))
#endif

#define L3_VERSION_MAJOR 0
#define L3_VERSION_MINOR 1
#define L3_VERSION_PATCH 0

namespace l3 {

// The library's version, "0.1.0" (that of the shared library in use, which may be newer than
// the headers a host was built with).
[[nodiscard]] L3_API std::string version();

// Supervised fine-tuning, a reward model (Bradley-Terry), or direct preference optimisation of
// the policy itself (DPO) on preference pairs.
enum class Phase { sft, reward, dpo, grpo };

// A failure, with the exit code the CLI would give it: 2 bad usage or input (a wrong option, a
// missing or malformed file: fix and retry), 1 anything else. what() is one line naming the file,
// tensor or record at fault where there is one.
class L3_API Error : public std::runtime_error {
 public:
  Error(int exit_code, const std::string& message, bool from_another_rank = false);
  [[nodiscard]] int exit_code() const noexcept { return exit_code_; }
  // True on the ranks that did not fail themselves: another rank did, and its error (thrown
  // there) says why. A host printing errors can print only the others, as the CLI does.
  [[nodiscard]] bool from_another_rank() const noexcept { return from_another_rank_; }

 private:
  int exit_code_;
  bool from_another_rank_;
};

// One optimizer step, global over the session's ranks (the same values on every rank).
struct StepMetrics {
  std::int64_t step = 0;  // steps done, this one included (1-based)
  std::int64_t total_steps = 0;
  std::int64_t epoch = 0;
  // SFT: mean cross-entropy per loss token; reward: mean Bradley-Terry loss; DPO: mean DPO loss
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;          // before clipping
  std::int64_t tokens = 0;       // document tokens of the global batch (padding not counted)
  std::int64_t loss_tokens = 0;  // SFT: tokens in the loss
  std::int64_t pairs = 0;        // reward, DPO: preference pairs
  double tokens_per_s = 0;
  std::optional<double> mfu;  // model FLOPs utilisation, when the peak is known
  double data_wait_ms = 0;    // the training thread waited for data
  double step_ms = 0;
  double reduce_wait_ms = 0;  // waited for the gradient reduction after the backward pass
  double reduce_ms = 0;       // spent reducing gradients (overlapped or not)
  double gather_ms = 0;       // parameter all-gathers (ZeRO-1, ZeRO-3), on whichever thread
  double gather_wait_ms = 0;  // the step waited for them (ZeRO-3 prefetches: less than that)
  // ZeRO-3: layer groups gathered in the step, and how many of them were started while an
  // earlier group computed (on a thread, or on the GPU's communication stream).
  std::int64_t gathers = 0;
  std::int64_t gathers_prefetched = 0;
  double eta_seconds = 0;
  bool skipped = false;            // loss or gradient norm not finite: no update
  std::optional<double> accuracy;  // reward, DPO: pairs with r_chosen > r_rejected
  std::optional<double> margin;    // reward, DPO: mean r_chosen - r_rejected
  // DPO: the mean implicit rewards beta (log pi(y) - log pi_ref(y)) of the chosen and of the
  // rejected responses (TRL's rewards/chosen, rewards/rejected).
  std::optional<double> chosen_reward;
  std::optional<double> rejected_reward;
  // A phase's own metrics by name, in order (GRPO: TRL's reward, reward_std, kl, entropy,
  // clip_ratio/region_mean, completions/mean_length, ...; docs/TRAINING.md lists them).
  std::vector<std::pair<std::string, double>> extra;
};

// An evaluation on the validation data.
struct EvalMetrics {
  std::int64_t step = 0;
  Phase phase = Phase::sft;
  double loss = 0;  // SFT: mean cross-entropy per loss token; DPO: mean DPO loss
  double perplexity = 0;
  std::int64_t tokens = 0;
  double accuracy = 0;  // reward, DPO: pairs ranked correctly
  double margin = 0;
  double chosen_reward = 0;  // DPO: mean implicit rewards
  double rejected_reward = 0;
  double reward_mean = 0;
  double reward_std = 0;
  std::int64_t pairs = 0;
  std::int64_t skipped_samples = 0;  // too long for --seq-len
  double seconds = 0;
  // A phase's own results by name (GRPO: reward, the mean reward of greedy completions, ...).
  std::vector<std::pair<std::string, double>> extra;
};

// A committed checkpoint (weights, AdamW state, manifest; docs/FORMAT.md).
struct CheckpointInfo {
  std::int64_t step = 0;
  std::string directory;  // CKPT_DIR/step-NNNNNNNN
  std::int64_t bytes = 0;
  double seconds = 0;  // writing it (in the background unless checkpoint-sync)
};

struct RunSummary {
  std::int64_t steps = 0;       // optimizer steps done by this run
  std::int64_t first_step = 0;  // steps already done when it started (resumed)
  bool stopped = false;         // stopped early on request or deadline, with a checkpoint
  std::int64_t skipped_steps = 0;
  std::optional<StepMetrics> last_step;
  std::optional<EvalMetrics> last_eval;
  std::string checkpoint;  // the last checkpoint written, if any
  double seconds = 0;
  double tokens_per_s = 0;  // over the whole run
  // What the backend says about the run, as the run's log line (CUDA where cuDNN attention is in
  // use, the default --attention auto on sm_90 included: "attention: N calls on cuDNN, M on the
  // fallback (cuDNN declined: ...)"); empty if nothing.
  std::string backend_report;
};

struct MemoryPlan;

// Everything `llama3-hpc sft`, `reward`, `dpo` and `grpo` accept (docs/CLI.md), with the same
// names, defaults, checks and config files. A value type: copy it, change it, give it to a Session.
class L3_API RunConfig {
 public:
  // A command line without the program name: the phase, then options, e.g.
  // {"sft", "--model", "tiny", "--data", "dir", "--global-batch", "8", "--config", "f.ini"}.
  // Throws Error (exit code 2) for an unknown option, a bad value or a missing requirement.
  [[nodiscard]] static RunConfig from_args(const std::vector<std::string>& args);
  [[nodiscard]] static RunConfig from_args(std::initializer_list<std::string_view> args);
  // A config file of 'key = value' lines (keys: the long option names), for `phase`.
  [[nodiscard]] static RunConfig from_file(const std::string& path, Phase phase = Phase::sft);

  // Sets one option, as on the command line ("lr", "1e-5"; a switch takes "true"/"false"),
  // replacing an earlier value; checked at once (Error, exit code 2). Returns *this.
  RunConfig& set(std::string_view option, std::string_view value);
  RunConfig& set(std::string_view option, const char* value);
  RunConfig& set(std::string_view option, double value);
  RunConfig& set(std::string_view option, std::int64_t value);
  RunConfig& set(std::string_view option, int value);
  RunConfig& set(std::string_view option, bool value);
  // The option's value as the command line would show it ("" when unset and without default).
  [[nodiscard]] std::string get(std::string_view option) const;

  [[nodiscard]] Phase phase() const noexcept;
  // The equivalent command line (phase first): what from_args() would take back.
  [[nodiscard]] std::vector<std::string> args() const;
  // The resolved configuration as a JSON object (as in a checkpoint's manifest).
  [[nodiscard]] std::string to_json() const;

  RunConfig(const RunConfig& other);
  RunConfig& operator=(const RunConfig& other);
  RunConfig(RunConfig&& other) noexcept;
  RunConfig& operator=(RunConfig&& other) noexcept;
  ~RunConfig();

  struct Parsed;  // the library's view of it

 private:
  friend class Session;
  friend MemoryPlan plan_memory(const RunConfig& config, int ranks);
  explicit RunConfig(std::vector<std::string> args);
  std::vector<std::string> args_;  // phase, then options
  std::unique_ptr<Parsed> parsed_;
};

// Training data from the host's memory instead of HDF5 shards (--data): one rank's samples for
// one optimizer step. Token ids come from the model's tokenizer (Llama 3: tiktoken ids with the
// chat template applied by the host); loss_mask[t] = 1 makes token t a training target (predicted
// from the tokens before it; the first token never is), as in a prepared dataset (docs/FORMAT.md).
struct SftDocument {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> loss_mask;  // same length as tokens
};
struct PreferencePair {
  std::vector<std::int32_t> chosen;    // prompt + preferred response
  std::vector<std::int32_t> rejected;  // prompt + other response
  float margin = 0;                    // used with --margin-from-data
};
struct StepSamples {
  std::vector<SftDocument> documents;  // SFT
  std::vector<PreferencePair> pairs;   // reward
};

// Feeds a Session. fill() is called on every rank, on the training thread, once per optimizer
// step, with the 0-based step (a resumed run continues at the step it stopped at, so the same
// step must give the same samples for a restart to be exact). SFT: the documents are packed in
// order into this rank's --global-batch / ranks rows of --seq-len tokens (more is an error,
// fewer is fine); reward: at most --global-batch / ranks pairs. With a DataSource, --data is not
// used and --steps is required.
class L3_API DataSource {
 public:
  virtual ~DataSource() = default;
  virtual void fill(std::int64_t step, int rank, int ranks, StepSamples& out) = 0;

  DataSource() = default;
  DataSource(const DataSource&) = default;
  DataSource& operator=(const DataSource&) = default;
  DataSource(DataSource&&) = default;
  DataSource& operator=(DataSource&&) = default;
};

// What a run takes in the compute backend's memory on each rank (GPU memory with the CUDA
// backend), computed from the configuration without allocating anything: weights, fp32 master
// copy, gradients, this rank's AdamW moments, one micro-batch's activations (reward: two rows
// of --seq-len per pair, the worst case) and, on CUDA, the backend's scratch (the largest op's
// temporaries, the cuBLASLt workspace; not cuDNN's own). Not included: the CUDA context, NCCL's
// buffers and allocator fragmentation.
struct MemoryPlan {
  struct Line {
    std::string what;
    std::int64_t bytes = 0;
  };
  std::string backend;  // "cuda (bf16)" or "cpu (fp32)": what the plan assumes
  int ranks = 1;
  // What else it assumes, in words: the phase, ranks, backend, micro-batch, sequence length,
  // recompute and ZeRO stage ("sft on 8 ranks, cuda (bf16), micro-batch 1 x 8192 tokens, ...").
  std::string summary;
  std::vector<Line> lines;
  std::int64_t total_bytes = 0;
};
// The model is read from --model (preset or config.json) or --init (a checkpoint's manifest, a
// Hugging Face config.json). --backend auto plans for what would run here: CUDA when the library
// has it and a device is visible, else the CPU (--backend cuda plans for GPU nodes from a
// machine without one). Not collective.
[[nodiscard]] L3_API MemoryPlan plan_memory(const RunConfig& config, int ranks);

// A training run on the ranks of `comm`: SFT or reward, as the config says. The constructor is
// collective: it resolves the model (--init checkpoint or Hugging Face directory, or a preset),
// opens the data, builds the model and the optimizer, and resumes from the newest good
// checkpoint in --ckpt-dir (--resume auto).
class L3_API Session {
 public:
  Session(MPI_Comm comm, const RunConfig& config);
  // The same, with the training data from `data` (see DataSource); --val-data still works.
  Session(MPI_Comm comm, const RunConfig& config, std::shared_ptr<DataSource> data);
  // With a stop flag the host owns (`data` may be null): setting it, from a signal handler
  // (std::atomic<bool> is lock-free) or another thread, before or while this constructor runs,
  // stops building the run at its next safe point (between loading, resuming and DPO's
  // reference steps, every rank agreeing) with an l3::Error of exit code 75 and nothing to save;
  // afterwards it asks to stop as request_stop() does. The flag must outlive the Session.
  Session(MPI_Comm comm, const RunConfig& config, std::shared_ptr<DataSource> data,
          const std::atomic<bool>* stop);
  ~Session();  // waits for a checkpoint still being written
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  Session(Session&& other) noexcept;
  Session& operator=(Session&& other) noexcept;

  // The remaining steps, with the periodic evaluations and checkpoints, then the final
  // evaluation (with --val-data) and checkpoint (with --ckpt-dir). Returns early, with a
  // checkpoint, after request_stop() or near the deadline.
  RunSummary run();
  // One optimizer step (and the evaluation or checkpoint due after it); false once every step
  // is done or the run was stopped. A host-driven loop: while (session.step()) { ... }
  bool step();
  // Evaluates on --val-data now (nullopt without validation data).
  std::optional<EvalMetrics> evaluate();
  // Writes a checkpoint of the current state now and waits for it to be committed.
  CheckpointInfo checkpoint();

  // Asks for a checkpoint at the next step boundary, or to checkpoint and stop there. Not
  // collective: one rank asking is enough (the ranks agree at the boundary). Safe to call from
  // another thread or a signal handler.
  void request_checkpoint() noexcept;
  void request_stop() noexcept;

  // Called on every rank of the session, on the calling thread of step()/run(), with the global
  // values. Set them before running; several callbacks of a kind are called in order.
  void on_step(std::function<void(const StepMetrics&)> callback);
  void on_eval(std::function<void(const EvalMetrics&)> callback);
  void on_checkpoint(std::function<void(const CheckpointInfo&)> callback);

  [[nodiscard]] std::int64_t steps_done() const noexcept;
  [[nodiscard]] std::int64_t total_steps() const noexcept;
  [[nodiscard]] int rank() const noexcept;  // in the session's communicator
  [[nodiscard]] int size() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace l3
