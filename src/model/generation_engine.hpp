// Batched generation with continuous batching: many sequences at once on one rank, each with
// its own prompt, length limit and stop, for `generate --input` jobs and for online RL.
//
// The engine owns a KV cache of `slots` sequences of `capacity` positions each, in backend
// memory and the compute dtype: (layers, slots, capacity, n_kv_heads, head_dim) for keys and
// for values. Each pass runs the decoder (LlamaModel::forward_rows: the training pass's block,
// not a copy) on rows from every busy slot at once, so that every matmul has all of them as its
// rows:
//   - a slot that has just taken a prompt prefills it: the prompt's tokens as one packed causal
//     segment through the backend's training attention kernel (a long prompt in chunks of the
//     pass's spare rows; the chunks after the first attend to the cache);
//   - a slot that is generating decodes one token: its query row against its own cached
//     positions (Ops::decode_attention).
// Every row's keys and values go into the cache first (Ops::kv_cache_write). The rows that need
// a next token (a decoding slot's, the last of a completed prompt) are gathered, normed and
// multiplied by the lm_head into (rows, V) logits that stay on the backend, where
// Ops::sample_tokens draws the tokens and their log-probabilities: only the ids and those
// values come back to the host. When a sequence ends (a stop token, a stop check, its length
// limit) its slot takes the next request (continuous batching).
//
// A pass of decoding rows only runs, on a backend that captures (CUDA), at its bucket's fixed
// shape and as a graph recorded once per bucket and replayed per token (DecodePath below,
// docs/GPU.md "Decoding as CUDA graphs"): hundreds of launches become one.
//
// A request's token t is drawn with the uniform number CounterRng(seed, sampling, stream
// `sample`).uniform(record * 2^32 + t): a completion depends on its record, its sample index
// and the model, never on the batch, the slot or the rank it ran in.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kernels/ops.hpp"
#include "kernels/row_invariant_ops.hpp"
#include "model/llama_model.hpp"
#include "model/rope_table.hpp"

namespace l3::model {

// How every request of an engine is sampled.
struct SamplingSettings {
  double temperature = 0.0;  // 0: greedy
  double top_p = 1.0;
  std::int64_t top_k = 0;  // 0: no limit
  std::uint64_t seed = 0;
  std::vector<std::int32_t> stop_tokens{};  // end a sequence (left out of its tokens)
  std::int64_t vocab_limit = 0;             // draw only ids below it (a smaller tokenizer); 0: all
  // Log-probabilities of softmax(logits / temperature) (kernels::logit_scale), as TRL's GRPO
  // trains on them; false: of the raw logits.
  bool tempered_logprobs = false;
};

// Throws a usage Error naming the option for a negative or non-finite temperature, a top-p
// outside (0, 1] or a negative top-k.
void validate(const SamplingSettings& settings);

struct GenerationRequest {
  std::int64_t record = 0;  // < 2^32: keys the sampling (with sample), and the caller's own
  std::int64_t sample = 0;  // < 2^32
  std::vector<std::int32_t> prompt;
  std::int64_t max_new = 0;  // new tokens at most (a stop token included)
};

struct GenerationOutput {
  std::int64_t record = 0;
  std::int64_t sample = 0;
  std::vector<std::int32_t> tokens;  // the new tokens, without a stop token
  // log p(token) of each new token: log-softmax over the whole vocabulary, before top-k and
  // top-p, and before the temperature unless SamplingSettings::tempered_logprobs, as the
  // training forward's cross-entropy computes it with the same logit_scale
  std::vector<float> logprobs;
  bool stopped = false;  // ended on a stop token or the stop check, not on max_new
  // The stop token it ended on (-1: none) and its log-probability: what online RL trains on
  // as the completion's last token.
  std::int32_t stop_token = -1;
  float stop_logprob = 0.0F;
};

// How a pass that only decodes (one row per generating slot, no prompt rows) runs.
//   per_pass: as planned, its ops issued one by one (rows = decoding slots; the decode attention
//     sized by the longest row).
//   bucketed: at a fixed shape, issued one by one: the rows padded up to a bucket (the next power
//     of two, at most `slots`) with pad rows outside the cache (slot -1: nothing written or
//     read, their tokens not used), the decode attention sized by the capacity. The same work as
//     `graphs`, without them: what the tests compare graphs with, bit for bit.
//   graphs: bucketed, recorded once per bucket as a graph (Ops::capture; the first pass of a
//     bucket runs as bucketed and records it) and replayed: one launch per token instead of
//     hundreds. Only the inputs (tokens, positions, slots, uniforms) are uploaded before a
//     replay and the drawn tokens read back after it.
// bucketed and graphs need a backend that captures (Ops::can_capture: CUDA), a model without a
// parameter window and an engine run without a PassAgreement; elsewhere passes run per_pass.
// automatic: $L3_DECODE_GRAPHS: unset or 1 graphs, 0 per_pass, eager bucketed.
enum class DecodePath : std::uint8_t { automatic, per_pass, bucketed, graphs };

// The rows a decode-only pass of `rows` rows runs at under bucketed and graphs: the next power
// of two, at most `slots`.
[[nodiscard]] std::int64_t decode_bucket(std::int64_t rows, int slots);

struct EngineShape {
  int slots = 1;              // sequences in flight
  std::int64_t capacity = 0;  // positions per sequence: prompt + max_new at most
  // Prompts are prefilled in chunks of this many tokens (positions [0, C), [C, 2C), ...), each
  // in one pass: the first through the training attention, the later ones against the cache.
  // A token's arithmetic depends on its chunk, so engines that must agree bit for bit use one
  // chunk size. 0: 512.
  std::int64_t prefill_chunk = 0;
  // Rows per pass (decoding slots + prompt chunks): the activations' size; at least
  // slots - 1 + min(prefill_chunk, capacity), so that a chunk always fits beside the others'
  // decoding rows. 0: slots + min(prefill_chunk, capacity).
  std::int64_t max_rows = 0;
  DecodePath decode = DecodePath::automatic;  // resolved by the engine (shape())
};

// Backend bytes an engine of this shape allocates (the memory plan counts them): the KV cache
// and the pass's work buffers.
struct EngineMemory {
  std::int64_t kv_cache = 0;
  std::int64_t workspace = 0;
  [[nodiscard]] std::int64_t total() const noexcept { return kv_cache + workspace; }
};
[[nodiscard]] EngineMemory engine_memory(const ModelConfig& config, kernels::DType compute,
                                         const EngineShape& shape, int lora_rank = 0);

class GenerationEngine {
 public:
  // The model must have a language-model head; it is read, never modified, and must outlive
  // the engine. A usage Error when capacity exceeds max_position_embeddings.
  GenerationEngine(LlamaModel& model, const EngineShape& shape, SamplingSettings settings);
  ~GenerationEngine();
  GenerationEngine(const GenerationEngine&) = delete;
  GenerationEngine& operator=(const GenerationEngine&) = delete;
  GenerationEngine(GenerationEngine&&) = delete;
  GenerationEngine& operator=(GenerationEngine&&) = delete;

  // With prefill_chunk, max_rows and decode resolved (decode: what this backend and model allow).
  [[nodiscard]] const EngineShape& shape() const noexcept { return shape_; }
  // Graphs recorded so far (DecodePath::graphs): one per bucket, again when one went stale.
  [[nodiscard]] std::int64_t graphs_recorded() const noexcept { return graphs_recorded_; }
  // Decode-only passes that replayed a graph.
  [[nodiscard]] std::int64_t graph_replays() const noexcept { return graph_replays_; }
  // How the requests run from now on are sampled (online RL: a seed per step, greedy for
  // evaluations). A usage Error as validate() says.
  void set_sampling(SamplingSettings settings);
  [[nodiscard]] const SamplingSettings& sampling() const noexcept { return settings_; }

  // The next request, or nullopt when there are none left (asked only while a slot is free).
  using RequestSource = std::function<std::optional<GenerationRequest>()>;
  // A finished sequence, in the order they finish.
  using OutputSink = std::function<void(GenerationOutput&&)>;
  // Whether a sequence should stop after its latest token (stop strings): called with its
  // request and its new tokens so far; empty: none.
  using StopCheck =
      std::function<bool(const GenerationRequest& request, std::span<const std::int32_t> tokens)>;
  // Collective engines (a model sharded over ranks): called before each pass with whether this
  // rank has work; returns whether any rank has. A rank without work then runs an empty pass
  // (the same gathers, nothing computed) until no rank has any. Empty: this rank alone.
  using PassAgreement = std::function<bool(bool has_work)>;

  // Continuous batching until the source is empty and every sequence has ended. A request whose
  // prompt is empty or with max_new + prompt beyond capacity is a usage Error.
  void run(const RequestSource& next, const OutputSink& done, const StopCheck& stop = {},
           const PassAgreement& agree = {});

  // Multi-turn sequences (online RL with an environment, train/grpo/episode.hpp). When a
  // sequence's turn ends (a stop token, its max_new), the caller may continue it: `tokens` (an
  // environment's messages, the next turn's header) go after the turn's tokens (its stop token
  // included) and are prefilled against the slot's cache, never generated, and the sequence
  // then generates its next turn of at most `max_new` (>= 1) tokens. Nothing before is run
  // again. The draws go on counting across turns: a sequence's k-th drawn token has the
  // uniform number of index record * 2^32 + k whatever its turn, so an episode depends on its
  // record, sample, model and continuations only.
  struct Continuation {
    std::vector<std::int32_t> tokens;
    std::int64_t max_new = 0;
  };
  // A turn has ended (its tokens, log-probabilities and stop as GenerationOutput has them, for
  // this turn alone): its continuation, or nullopt to end the sequence.
  using TurnEnd = std::function<std::optional<Continuation>(GenerationOutput&& turn)>;
  // run() with turns: the sequence so far plus a continuation must fit in the capacity (a
  // usage Error otherwise, as for a request).
  void run_turns(const RequestSource& next, const TurnEnd& turn_end,
                 const PassAgreement& agree = {});

 private:
  struct Slot;
  struct PassRows;
  struct PassShape;

  void admit(Slot& slot, GenerationRequest&& request);
  // run() and run_turns(): `turn_end` empty ends every sequence at its first turn (done).
  void run_loop(const RequestSource& next, const OutputSink& done, const TurnEnd& turn_end,
                const StopCheck& stop, const PassAgreement& agree);
  // Continues `slot`'s sequence after its turn as `next` says (run_turns).
  void continue_slot(Slot& slot, Continuation&& next);
  // Plans the next pass's rows from the busy slots; empty when there is nothing to run.
  [[nodiscard]] PassRows plan_pass();
  // Runs one pass and samples a token for each row that wants one: (token, logprob) each.
  void run_pass(const PassRows& rows, std::vector<std::int32_t>& tokens,
                std::vector<float>& logprobs);
  // A decode-only pass at its bucket's shape (DecodePath::bucketed and graphs).
  void run_decode(const PassRows& rows, std::vector<std::int32_t>& tokens,
                  std::vector<float>& logprobs, bool graphs);
  // The pass's device work once its inputs are in tokens_ ... uniforms_: the blocks, the
  // gather, the final norm, the lm_head and the draws into sampled_ and sampled_logprobs_.
  // Capture-safe when the shape has no fresh rows and no host positions.
  void enqueue_pass(const PassShape& p);
  // The uniform numbers of the rows that draw a token (their slots' requests and token counts).
  [[nodiscard]] std::vector<double> uniforms(const std::vector<int>& logit_slots) const;

  LlamaModel& model_;
  kernels::Ops& ops_;
  // The model's backend with row-invariant matmuls: a completion does not depend on its batch.
  kernels::RowInvariantOps invariant_ops_;
  EngineShape shape_;
  SamplingSettings settings_;
  std::vector<Slot> slots_;
  std::int64_t admissions_ = 0;
  std::map<std::int64_t, std::unique_ptr<kernels::OpsGraph>> graphs_;  // by bucket
  std::int64_t graphs_recorded_ = 0;
  std::int64_t graph_replays_ = 0;
  RopeBuffers rope_;
  kernels::Buffer k_cache_, v_cache_;  // (layers, slots, capacity, n_kv_heads, head_dim)
  // The pass's inputs (max_rows) i32 and outputs.
  kernels::Buffer tokens_, positions_, row_slots_, cu_seqlens_, logit_rows_;
  kernels::Buffer x_, ln_, rstd_, q_, k_, v_, att_, lse_, h_, gate_, up_, act_;
  std::array<kernels::Buffer, kLoraTargetCount> lora_u_;
  kernels::Buffer picked_, picked_norm_, picked_rstd_;     // (slots, H), (slots, H), (slots)
  kernels::Buffer logits_;                                 // (slots, V) f32
  kernels::Buffer uniforms_, sampled_, sampled_logprobs_;  // (slots) f64, i32, f32
};

}  // namespace l3::model
