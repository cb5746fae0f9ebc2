// `llama3-hpc generate --input FILE --output FILE`: completions of prompt records
// (cli/prompt_records.hpp) as an MPI batch job on the generation engine
// (model/generation_engine.hpp), docs/CLI.md "Batch generation".
//
// The records go to the ranks in rounds: a round's records are dealt out over the ranks (the
// p-th to rank p mod N), each rank runs its share, every sample of every record, through its
// engine with continuous batching, and rank 0 appends the round's lines to the output in input
// order. A completion depends only on its record's line number, its sample index, the options
// and the model, so the output is the same whatever the ranks and --batch-size.
//
// The output is written as OUTPUT.partial and renamed to OUTPUT at the end. After every round
// rank 0 records the progress (records done, the temporary file's length and a fingerprint of
// the options, model and input) in OUTPUT.progress, written atomically: SIGUSR1, SIGTERM or the
// --deadline stop the job at a round boundary with exit 75, and the same command continues from
// there (a changed option, model or input is refused, exit 2).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "kernels/ops.hpp"
#include "model/generation_engine.hpp"

namespace l3::cli {

struct GenerationJob {
  std::string model_path;  // --init
  std::string adapter;     // --adapter; empty: none
  std::optional<std::string> tokenizer;
  bool ignore_tokenizer_mismatch = false;
  std::string input;
  std::string output;  // empty only for a dry run
  std::int64_t num_samples = 1;
  std::int64_t max_new = 128;
  model::SamplingSettings sampling;  // temperature, top-p, top-k, seed (the stops are added)
  std::vector<std::string> stop_strings;
  bool logprobs = false;
  std::int64_t batch_size = 0;  // sequences in flight per rank; 0: from the memory plan
  std::optional<double> deadline_unix;
  bool shard_parameters = false;
  bool dry_run_memory = false;
  // The backend the engine runs on (cuda: bf16 weights and KV cache on the device; the output is
  // the same whatever the ranks and batch size on the cpu backend only).
  kernels::Backend backend = kernels::Backend::automatic;
};

// The most sequences in flight per rank that --batch-size chooses by itself.
inline constexpr std::int64_t kMaxDefaultBatchSize = 64;

// Runs the job on every rank of context.world: core::kExitOk, or core::kExitCheckpointed when
// stopped with its progress saved. Errors are exceptions (bad records: bad_input with file:line,
// found before anything is written).
int run_generation_job(const CommandContext& context, const GenerationJob& job);

}  // namespace l3::cli
