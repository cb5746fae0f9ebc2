#include "cli/generation_job.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/inference_model.hpp"
#include "cli/prompt_records.hpp"
#include "cli/record_scoring.hpp"
#include "cli/stop_signals.hpp"
#include "core/bounded_read.hpp"
#include "core/deadline.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/host_memory.hpp"
#include "core/input_file.hpp"
#include "core/output_file.hpp"
#include "core/path_safety.hpp"
#include "core/timer.hpp"
#include "dist/collectives.hpp"
#include "kernels/backend_options.hpp"
#include "kernels/backends.hpp"
#include "model/memory_plan.hpp"
#include "model/parameter_layout.hpp"

namespace l3::cli {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr std::string_view kProgressFormat = "llama3-hpc/generate-progress/1";
// Records dealt to each rank per round, in sequences per engine slot.
constexpr std::int64_t kSequencesPerSlot = 4;

std::string gib(std::int64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / kGiB);
}

// ---- the input, checked before anything is written ------------------------------------------

struct InputScan {
  std::int64_t records = 0;
  std::int64_t longest_prompt = 0;
};

// The output lines of one record held in memory at once (its samples', each carrying the
// record's fields) are at most this, or an eighth of the node's memory: a 50 MB field with
// --num-samples 32 is 1.6 GB of lines, gathered on rank 0 and written in one piece.
constexpr std::int64_t kMaxRecordOutputBytes = std::int64_t{1} << 30U;
// A round of records is cut short once its lines would pass this (at least one record a round).
constexpr std::int64_t kRoundOutputBytes = std::int64_t{256} << 20U;

// What one record's output lines take, estimated from its line's length: each sample's line
// carries the record's fields, its completion and ids (and with --logprobs one number per token
// and the prompt's ids), for at most --max-new tokens.
std::int64_t record_output_bytes(std::string_view text, const GenerationJob& job) {
  const std::int64_t per_token = job.logprobs ? 48 : 24;  // text, an id, maybe a log-probability
  return job.num_samples * (static_cast<std::int64_t>(text.size()) * (job.logprobs ? 2 : 1) +
                            job.max_new * per_token + 256);
}

// Every rank reads the file and formats every N-th record; the first bad record in file order
// is reported by the rank that found it, the others stop with it (one error line).
InputScan scan_input(const dist::World& world, const GenerationJob& job,
                     const tokenizer::Tokenizer& tokenizer, std::int64_t max_prompt) {
  InputScan scan;
  std::exception_ptr failure;
  std::int64_t failed_line = std::numeric_limits<std::int64_t>::max();
  const std::int64_t record_limit = std::min(kMaxRecordOutputBytes, core::host_memory_bytes() / 8);
  for_each_prompt_line(job.input, [&](std::string_view text, std::int64_t line) {
    const std::int64_t ordinal = scan.records++;
    if (ordinal % world.size() != world.rank() || failure) return;
    try {
      if (line > std::numeric_limits<std::uint32_t>::max()) {
        throw core::bad_input("more lines than generation can number (2^32)",
                              {.file = job.input, .line = line});
      }
      if (const std::int64_t bytes = record_output_bytes(text, job); bytes > record_limit) {
        throw core::bad_input(
            fmt::format("its {} samples would make about {} MB of output lines (each carries the "
                        "record's {} MB of fields), more than generate holds at once ({} MB); "
                        "carry less in the record, or ask fewer --num-samples",
                        job.num_samples, bytes >> 20U,
                        static_cast<std::int64_t>(text.size()) >> 20U, record_limit >> 20U),
            {.file = job.input, .line = line});
      }
      const PromptRecord record = read_prompt_record(tokenizer, text, job.input, line, max_prompt);
      scan.longest_prompt =
          std::max(scan.longest_prompt, static_cast<std::int64_t>(record.prompt.size()));
    } catch (...) {
      failure = std::current_exception();
      failed_line = line;
    }
  });
  const std::int64_t first =
      dist::all_reduce(world.comm(), failed_line, dist::ReduceOp::min, "the first bad record");
  if (first != failed_line) failure = nullptr;
  dist::agree_on_failure(world, failure);
  scan.longest_prompt =
      dist::all_reduce(world.comm(), scan.longest_prompt, dist::ReduceOp::max, "prompt lengths");
  return scan;
}

// ---- memory -------------------------------------------------------------------------------

struct MemoryChoice {
  std::int64_t weights = 0;  // bytes per rank
  model::EngineMemory engine;
  model::EngineShape shape;
  std::int64_t available = 0;  // bytes per rank
};

model::EngineShape engine_shape(std::int64_t slots, std::int64_t capacity) {
  return {.slots = static_cast<int>(slots), .capacity = capacity};
}

// The weights of one rank (the whole model, or with --shard-parameters 1/N and two gathered
// layer groups) and an engine of the batch size asked for, or of the most sequences that fit
// in this rank's share of the node's memory (at most kMaxDefaultBatchSize, and no more than the
// rank has sequences to run).
MemoryChoice choose_memory(const dist::World& world, const GenerationJob& job,
                           const model::ModelConfig& config, std::int64_t capacity,
                           std::int64_t sequences, kernels::Ops& ops) {
  const kernels::DType compute = ops.compute_dtype();
  const auto width = static_cast<std::int64_t>(kernels::dtype_size(compute));
  const model::ParameterLayout layout(config, model::HeadKind::language_model);
  MemoryChoice m;
  const int ranks = world.size();
  m.weights =
      job.shard_parameters
          ? width * ((layout.total() + ranks - 1) / ranks + model::gradient_slot_elements(layout))
          : width * layout.total();
  // The host's memory shared by the node's ranks, or this rank's device.
  m.available = ops.backend() == kernels::Backend::cpu
                    ? core::host_memory_bytes() / std::max(1, world.local_size())
                    : ops.memory_capacity();
  const auto need = [&](std::int64_t slots) {
    return m.weights + model::engine_memory(config, compute, engine_shape(slots, capacity)).total();
  };
  const std::int64_t per_rank = std::max<std::int64_t>(1, (sequences + ranks - 1) / ranks);
  std::int64_t slots = job.batch_size;
  if (slots > 0) {
    if (m.available > 0 && need(slots) > m.available) {
      std::int64_t fit = 0;  // the most that fit: need(fit) <= available < need(slots)
      for (std::int64_t high = slots; high - fit > 1;) {
        const std::int64_t middle = fit + (high - fit) / 2;
        (need(middle) <= m.available ? fit : high) = middle;
      }
      const model::EngineMemory e =
          model::engine_memory(config, compute, engine_shape(slots, capacity));
      throw core::usage_error(fmt::format(
          "--batch-size {} needs {} per rank (the model {}, the KV cache {}, the pass's buffers "
          "{}), more than the {} a rank has here ({} rank{} on this node); {}",
          slots, gib(need(slots)), gib(m.weights), gib(e.kv_cache), gib(e.workspace),
          gib(m.available), world.local_size(), world.local_size() == 1 ? "" : "s",
          fit > 0 ? fmt::format("at most {} fit", fit) : std::string("not even 1 fits")));
    }
  } else {
    slots = 0;
    for (std::int64_t s = 1; s <= std::min(kMaxDefaultBatchSize, per_rank); ++s) {
      if (m.available > 0 && need(s) > m.available) break;
      slots = s;
    }
    if (slots == 0) {
      throw core::bad_input(fmt::format(
          "generation needs {} per rank for the model and one sequence of {} positions, more "
          "than the {} a rank has here ({} rank{} on this node); lower --max-new{}",
          gib(need(1)), capacity, gib(m.available), world.local_size(),
          world.local_size() == 1 ? "" : "s",
          job.shard_parameters ? ", or use more nodes" : ", or --shard-parameters on more nodes"));
    }
  }
  m.shape = engine_shape(slots, capacity);
  m.engine = model::engine_memory(config, compute, m.shape);
  return m;
}

void print_memory_plan(const dist::World& world, const GenerationJob& job, const MemoryChoice& m,
                       std::int64_t records, const kernels::Ops& ops) {
  if (!world.is_root()) return;
  const auto line = [](std::string_view what, std::int64_t bytes) {
    return fmt::format("  {:<62} {:>9.2f} GiB\n", what, static_cast<double>(bytes) / kGiB);
  };
  std::string text = fmt::format(
      "memory per rank: generate, {} record{} x {} sample{}, batch {} (sequences in flight per "
      "rank{}), {} positions per sequence, {} {}\n",
      records, records == 1 ? "" : "s", job.num_samples, job.num_samples == 1 ? "" : "s",
      m.shape.slots, job.batch_size > 0 ? "" : ", from this plan", m.shape.capacity, ops.name(),
      kernels::dtype_name(ops.compute_dtype()));
  text += line(job.shard_parameters ? "weights (1/N, and two gathered layer groups)" : "weights",
               m.weights);
  text +=
      line(fmt::format("KV cache ({} sequences x {} positions)", m.shape.slots, m.shape.capacity),
           m.engine.kv_cache);
  text += line("the passes' activations and logits", m.engine.workspace);
  text += line("available to this rank", m.available);
  text +=
      "  not included: the program, the MPI library's buffers, the memory allocator's "
      "fragmentation\n";
  text += line("total", m.weights + m.engine.total());
  std::cout << text << std::flush;
}

// ---- output lines ---------------------------------------------------------------------------

// The earliest stop string in `text`: its offset, or npos.
std::size_t first_stop(std::string_view text, const std::vector<std::string>& stops) {
  std::size_t at = std::string_view::npos;
  for (const std::string& s : stops) at = std::min(at, text.find(s));
  return at;
}

std::string output_line(const PromptRecord& record, const model::GenerationOutput& out,
                        const tokenizer::Tokenizer& tokenizer, const GenerationJob& job) {
  std::string text = tokenizer.decode(out.tokens);
  text.resize(std::min(text.size(), first_stop(text, job.stop_strings)));
  ordered_json line = {{"line", record.line},
                       {"sample", out.sample},
                       {"completion", std::move(text)},
                       {"ids", out.tokens},
                       {"stopped", out.stopped}};
  if (job.logprobs) {
    json logprobs = json::array();
    for (const float p : out.logprobs) logprobs.push_back(json_number(p));
    line["logprobs"] = std::move(logprobs);
    line["prompt_ids"] = record.prompt;
  }
  for (const auto& item : record.carried.items()) line[item.key()] = item.value();
  // Decoded bytes may cut a UTF-8 character: invalid sequences become U+FFFD.
  return line.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + '\n';
}

// ---- the files: OUTPUT.partial and OUTPUT.progress (rank 0) ----------------------------------

// The whole lines ("\n"-terminated) in the first `bytes` bytes of the file open as `fd`, read in
// blocks (a partial output may be gigabytes): what a saved progress is checked against.
std::int64_t count_lines(int fd, std::int64_t bytes, const std::string& path) {
  std::vector<char> block(std::size_t{1} << 20U);
  std::int64_t lines = 0;
  for (std::int64_t at = 0; at < bytes;) {
    const auto want = static_cast<std::size_t>(
        std::min<std::int64_t>(bytes - at, static_cast<std::int64_t>(block.size())));
    const ssize_t got = ::pread(fd, block.data(), want, at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw core::bad_input(
          fmt::format("cannot read: {}", got < 0 ? core::errno_text(errno) : "shorter than said"),
          {.file = path});
    }
    lines += std::count(block.data(), block.data() + got, '\n');
    at += got;
  }
  return lines;
}

struct Progress {
  std::string fingerprint;
  std::int64_t records = 0;  // records done (non-blank lines, from the first)
  std::int64_t bytes = 0;    // of the temporary file
  std::int64_t completions = 0;
  std::int64_t tokens = 0;
};

class OutputFiles {
 public:
  explicit OutputFiles(const std::string& output)
      : output_(output), partial_(output + ".partial"), progress_(output + ".progress") {}
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;
  OutputFiles(OutputFiles&&) = delete;
  OutputFiles& operator=(OutputFiles&&) = delete;
  ~OutputFiles() {
    if (fd_ >= 0) ::close(fd_);
  }

  [[nodiscard]] const std::string& progress_path() const noexcept { return progress_; }

  // The saved progress of an interrupted run of the same job, or a new job's files: the
  // progress written first, then the temporary file created exclusively.
  // `records`: the input's records, `samples` per record: what a saved progress may claim.
  Progress open(const std::string& fingerprint, std::int64_t records, std::int64_t samples) {
    Progress p{.fingerprint = fingerprint};
    core::require_output_file(progress_, "the progress file of --output");
    core::require_output_file(partial_, "the temporary file of --output");
    if (core::entry_exists(progress_)) {
      const json saved = core::read_json_object(progress_, "a progress file of generate");
      if (saved.value("format", "") != kProgressFormat || !saved.contains("records") ||
          !saved["records"].is_number_integer() || !saved.contains("bytes") ||
          !saved["bytes"].is_number_integer()) {
        throw core::bad_input(
            fmt::format("not a progress file of generate; remove it (and {}) to start over",
                        partial_),
            {.file = progress_});
      }
      if (saved.value("fingerprint", "") != fingerprint) {
        throw core::bad_input(
            fmt::format("the options, the model or the input changed since the interrupted run "
                        "that saved it; run the same command to continue, or remove it and {} to "
                        "start over",
                        partial_),
            {.file = progress_});
      }
      p.records = saved["records"].get<std::int64_t>();
      p.bytes = saved["bytes"].get<std::int64_t>();
      p.completions = saved.value("completions", std::int64_t{0});
      p.tokens = saved.value("tokens", std::int64_t{0});
      if (p.records < 0 || p.records > records || p.bytes < 0 || p.tokens < 0 ||
          p.completions != p.records * samples) {
        throw core::bad_input(
            fmt::format("records {} records, {} completions and {} bytes done, which the job "
                        "({} records x {} samples) cannot have written; remove it and {} to "
                        "start over",
                        p.records, p.completions, p.bytes, records, samples, partial_),
            {.file = progress_});
      }
      if (core::entry_exists(partial_)) {
        // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
        fd_ = ::open(partial_.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);  // read: its lines counted
        if (fd_ < 0) {
          throw core::bad_input(fmt::format("cannot be continued: cannot open it to write: {}",
                                            core::errno_text(errno)),
                                {.file = partial_});
        }
        struct stat st {};
        if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
          throw core::bad_input("cannot be continued: not a regular file with one name",
                                {.file = partial_});
        }
        if (st.st_size < p.bytes) {
          throw core::bad_input(
              fmt::format("holds {} bytes, fewer than the {} its progress file records; remove it "
                          "and {} to start over",
                          st.st_size, p.bytes, progress_),
              {.file = partial_});
        }
        char last = '\n';  // the recorded bytes end a line (or are none)
        if (p.bytes > 0 && ::pread(fd_, &last, 1, p.bytes - 1) != 1) last = '\0';
        if (const std::int64_t lines = count_lines(fd_, p.bytes, partial_);
            lines != p.completions || last != '\n') {
          throw core::bad_input(
              fmt::format("records {} completions in the first {} bytes of {}, which hold {} "
                          "whole lines{}; remove both to start over",
                          p.completions, p.bytes, partial_, lines,
                          last == '\n' ? "" : " and end inside a line"),
              {.file = progress_});
        }
        if (::ftruncate(fd_, p.bytes) != 0 || ::lseek(fd_, 0, SEEK_END) < 0) {
          throw core::bad_input(fmt::format("cannot cut back to the {} bytes its progress file "
                                            "records: {}",
                                            p.bytes, core::errno_text(errno)),
                                {.file = partial_});
        }
      } else if (p.bytes == 0 && p.records == 0) {
        fd_ = core::create_exclusive(partial_);
      } else {
        throw core::bad_input(
            fmt::format("its temporary file {} is missing (if {} is complete, remove the progress "
                        "file)",
                        partial_, output_),
            {.file = progress_});
      }
      return p;
    }
    if (core::entry_exists(partial_)) {
      throw core::bad_input(
          fmt::format("exists without its progress file {}: not written by an interrupted run of "
                      "this job, and not overwritten; remove it",
                      progress_),
          {.file = partial_});
    }
    save(p);
    fd_ = core::create_exclusive(partial_);
    return p;
  }

  void append(std::string_view text) {
    while (!text.empty()) {
      const ssize_t n = ::write(fd_, text.data(), text.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        throw core::internal_error(fmt::format("cannot write: {}", core::errno_text(errno)),
                                   {.file = partial_});
      }
      text.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // The temporary file's data on the disk, then the progress that counts it.
  void checkpoint(const Progress& p) {
    if (::fsync(fd_) != 0) {
      throw core::internal_error(fmt::format("fsync failed: {}", core::errno_text(errno)),
                                 {.file = partial_});
    }
    save(p);
  }

  // The complete output in place; the progress file removed.
  void finish() {
    if (::fsync(fd_) != 0 || ::close(fd_) != 0) {
      fd_ = -1;
      throw core::internal_error(fmt::format("cannot complete: {}", core::errno_text(errno)),
                                 {.file = partial_});
    }
    fd_ = -1;
    core::require_output_file(output_, "--output");  // again: it may have changed meanwhile
    core::rename_path(partial_, output_);
    const fs::path parent = fs::absolute(fs::path(output_)).parent_path();
    core::fsync_path(parent.string());
    std::error_code ignored;
    fs::remove(progress_, ignored);
  }

 private:
  void save(const Progress& p) const {
    const ordered_json saved = {{"format", kProgressFormat},    {"fingerprint", p.fingerprint},
                                {"records", p.records},         {"bytes", p.bytes},
                                {"completions", p.completions}, {"tokens", p.tokens}};
    core::write_file_atomically(progress_, saved.dump() + '\n');
  }

  std::string output_;
  std::string partial_;
  std::string progress_;
  int fd_ = -1;
};

// What the output depends on: the options that change it, the model and the tokenizer, and the
// input's bytes.
std::string fingerprint(const GenerationJob& job, const InferenceModel& model,
                        const tokenizer::Tokenizer& tokenizer, kernels::Backend backend) {
  ordered_json what = {
      {"backend", kernels::backend_name(backend)},
      {"max_new", job.max_new},
      {"num_samples", job.num_samples},
      {"temperature", job.sampling.temperature},
      {"top_p", job.sampling.top_p},
      {"top_k", job.sampling.top_k},
      {"seed", job.sampling.seed},
      {"stop", job.stop_strings},
      {"logprobs", job.logprobs},
      {"model", fs::absolute(model.step_dir).lexically_normal().string()},
      {"step", model.manifest.step},
      {"adapter",
       job.adapter.empty() ? std::string() : fs::absolute(job.adapter).lexically_normal().string()},
      {"tokenizer", tokenizer.sha256()},
      {"input", tokenizer::sha256_file(job.input)}};
  // Only when set: the fingerprints of earlier partial outputs stay what they were.
  if (job.logprobs && job.sampling.tempered_logprobs) what["tempered_logprobs"] = true;
  return tokenizer::sha256_text(what.dump());
}

// Checks of --output before anything is read: a file in an existing directory, not the input.
void check_output(const GenerationJob& job) {
  const fs::path out(job.output);
  if (job.output.empty()) throw core::usage_error("--output must not be empty");
  std::error_code ec;
  if (fs::is_directory(out, ec)) {
    throw core::usage_error(fmt::format("--output {} is a directory; name a file", job.output));
  }
  const fs::path parent = fs::absolute(out).parent_path();
  if (!fs::is_directory(parent, ec)) {
    throw core::usage_error(
        fmt::format("--output {}: the directory {} does not exist", job.output, parent.string()));
  }
  core::require_output_file(job.output, "--output");
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    throw core::bad_input(fmt::format("--output: cannot create files in {}: {}", parent.string(),
                                      core::errno_text(errno)),
                          {.file = job.output});
  }
  if (const long longest = ::pathconf(parent.c_str(), _PC_NAME_MAX);
      longest > 0 && out.filename().string().size() + std::string_view(".progress").size() +
                             std::string_view(".tmp-4294967295-99999").size() >
                         static_cast<std::size_t>(longest)) {
    throw core::bad_input(fmt::format("--output: the name is too long for {} (its files, such "
                                      "as NAME.progress, must fit in {} bytes)",
                                      parent.string(), longest),
                          {.file = job.output});
  }
  if (fs::exists(out, ec) && fs::equivalent(out, fs::path(job.input), ec)) {
    throw core::usage_error(fmt::format("--output {} is the --input file", job.output));
  }
}

// ---- the rounds -----------------------------------------------------------------------------

struct RoundResult {
  std::string lines;  // this rank's records' lines, record by record, sample by sample
  std::int64_t tokens = 0;
  bool abandoned = false;  // stopped by a signal before its end
};

RoundResult run_share(model::GenerationEngine& engine, const std::vector<PromptRecord>& records,
                      const GenerationJob& job, const tokenizer::Tokenizer& tokenizer,
                      const model::GenerationEngine::PassAgreement& agree) {
  const auto k = static_cast<std::size_t>(job.num_samples);
  std::vector<model::GenerationOutput> outputs(records.size() * k);
  std::size_t next = 0;
  RoundResult result;
  const auto source = [&]() -> std::optional<model::GenerationRequest> {
    if (next == outputs.size() || stop_flag().load()) return std::nullopt;
    const PromptRecord& record = records[next / k];
    model::GenerationRequest request{.record = record.line,
                                     .sample = static_cast<std::int64_t>(next % k),
                                     .prompt = record.prompt,
                                     .max_new = job.max_new};
    ++next;
    return request;
  };
  std::vector<std::int64_t> lines(records.size());
  for (std::size_t i = 0; i < records.size(); ++i) lines[i] = records[i].line;
  const auto done = [&](model::GenerationOutput&& out) {
    // the record's place in this share: lines ascend
    const auto it = std::lower_bound(lines.begin(), lines.end(), out.record);
    const std::size_t at =
        static_cast<std::size_t>(it - lines.begin()) * k + static_cast<std::size_t>(out.sample);
    outputs[at] = std::move(out);
  };
  const auto stop = [&](const model::GenerationRequest& /*request*/,
                        std::span<const std::int32_t> tokens) {
    if (stop_flag().load()) return true;
    if (job.stop_strings.empty()) return false;
    return first_stop(tokenizer.decode(tokens), job.stop_strings) != std::string_view::npos;
  };
  engine.run(source, done, stop, agree);
  result.abandoned = next < outputs.size() || stop_flag().load();
  if (result.abandoned) return result;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    result.tokens += static_cast<std::int64_t>(outputs[i].tokens.size());
    result.lines += output_line(records[i / k], outputs[i], tokenizer, job);
  }
  return result;
}

// Rank 0: the round's lines in input order, from each rank's share (position p of the round
// went to rank p mod N).
std::string interleave(const std::vector<std::string>& shares, std::size_t round_size,
                       std::int64_t samples) {
  std::vector<std::size_t> cursor(shares.size(), 0);
  std::string all;
  for (std::size_t p = 0; p < round_size; ++p) {
    const std::size_t r = p % shares.size();
    for (std::int64_t s = 0; s < samples; ++s) {
      const std::size_t end = shares[r].find('\n', cursor[r]);
      if (end == std::string::npos) {
        throw core::internal_error("generate: a rank sent fewer lines than its records");
      }
      all.append(shares[r], cursor[r], end + 1 - cursor[r]);
      cursor[r] = end + 1;
    }
  }
  return all;
}

}  // namespace

int run_generation_job(const CommandContext& context, const GenerationJob& job) {
  const dist::World& world = context.world;
  if (!job.dry_run_memory) check_output(job);
  const core::Stopwatch load_time;
  InferenceModel loaded =
      describe_inference_model(job.model_path, model::HeadKind::language_model, job.adapter);
  const tokenizer::Tokenizer tokenizer =
      load_inference_tokenizer(job.tokenizer, loaded, job.ignore_tokenizer_mismatch, context.log);
  const model::ModelConfig& config = loaded.manifest.model;

  // The records, all checked before anything is written or loaded.
  const std::int64_t max_prompt = config.max_position_embeddings - job.max_new;
  const InputScan scan = scan_input(world, job, tokenizer, max_prompt);
  const std::int64_t capacity = std::max<std::int64_t>(1, scan.longest_prompt + job.max_new);
  std::optional<MemoryChoice> memory;
  std::unique_ptr<kernels::Ops> ops;
  std::exception_ptr failure;
  try {
    ops = kernels::make_ops(job.backend, world.local_rank());
    memory = choose_memory(world, job, config, capacity, scan.records * job.num_samples, *ops);
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
  if (job.dry_run_memory) {
    print_memory_plan(world, job, *memory, scan.records, *ops);
    return core::kExitOk;
  }

  // Rank 0's files: a new job's, or the interrupted one's to continue.
  std::optional<OutputFiles> files;
  Progress progress;
  try {
    if (world.is_root()) {
      files.emplace(job.output);
      progress = files->open(fingerprint(job, loaded, tokenizer, ops->backend()), scan.records,
                             job.num_samples);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
  std::int64_t done = dist::broadcast_value(world.comm(), progress.records, 0, "the records done");
  if (done > 0) {
    context.log.info("continuing {}: {} of {} records done", job.output, done, scan.records);
  }
  const auto stopped = [&](std::string_view why) {
    if (world.is_root()) {
      std::cout << fmt::format(
                       "generate stopped by {} after {} of {} records, its progress saved in {}; "
                       "run the same command again to continue (exit 75)\n",
                       why, done, scan.records, files->progress_path())
                << std::flush;
    }
    return core::kExitCheckpointed;
  };
  const auto signal_name = [] {
    return stop_signal_name().empty() ? std::string("a signal to another rank")
                                      : std::string(stop_signal_name());
  };
  if (dist::all_reduce(world.comm(), stop_flag().load() ? 1 : 0, dist::ReduceOp::max, "stop") > 0) {
    return stopped(signal_name());
  }

  // The model, whole on every rank or sharded over them.
  load_inference_weights(loaded, model::HeadKind::language_model, train::ModelPurpose::generate,
                         job.shard_parameters ? &world : nullptr, std::move(ops));
  context.log.info(
      "loaded {}{} (step {}, {:.1f} M parameters) in {:.1f} s; {} records x {} samples, {} "
      "sequences in flight per rank of {} positions",
      loaded.step_dir, loaded.adapter.empty() ? "" : " with the adapter " + loaded.adapter,
      loaded.manifest.step, static_cast<double>(loaded.model->layout().parameter_count()) / 1e6,
      load_time.seconds(), scan.records, job.num_samples, memory->shape.slots, capacity);
  model::SamplingSettings sampling = job.sampling;
  sampling.stop_tokens = {tokenizer.special(tokenizer::Special::end_of_turn),
                          tokenizer.special(tokenizer::Special::end_of_text)};
  sampling.vocab_limit = tokenizer.vocab_size();
  model::GenerationEngine engine(*loaded.model, memory->shape, sampling);
  model::GenerationEngine::PassAgreement agree;
  if (job.shard_parameters) {
    agree = [&](bool work) {
      return dist::all_reduce(world.comm(), work ? 1 : 0, dist::ReduceOp::max, "pass work") > 0;
    };
  }

  const auto per_rank = std::max<std::int64_t>(
      1, (kSequencesPerSlot * memory->shape.slots + job.num_samples - 1) / job.num_samples);
  const auto round_size = static_cast<std::size_t>(per_rank * world.size());
  std::vector<std::pair<std::int64_t, std::string>> round;  // (line, text)
  const core::Stopwatch time;
  double longest_round = 0.0;
  std::int64_t tokens_now = 0;
  std::int64_t records_now = 0;
  bool stop = false;
  std::string stop_reason;
  std::int64_t ordinal = 0;

  const auto run_round = [&] {
    core::fault_point("generate.round", world.rank());
    const bool near_deadline =
        job.deadline_unix && core::unix_now() + 1.5 * longest_round > *job.deadline_unix;
    const int wants = stop_flag().load() ? 2 : near_deadline ? 1 : 0;
    const int agreed = dist::all_reduce(world.comm(), wants, dist::ReduceOp::max, "stop");
    if (agreed > 0) {
      stop = true;
      stop_reason = agreed == 2 ? signal_name() : std::string("the deadline (--deadline)");
      return;
    }
    const core::Stopwatch round_time;
    std::vector<PromptRecord> mine;
    for (std::size_t p = static_cast<std::size_t>(world.rank()); p < round.size();
         p += static_cast<std::size_t>(world.size())) {
      mine.push_back(
          read_prompt_record(tokenizer, round[p].second, job.input, round[p].first, max_prompt));
    }
    const RoundResult result = run_share(engine, mine, job, tokenizer, agree);
    if (dist::all_reduce(world.comm(), result.abandoned ? 1 : 0, dist::ReduceOp::max, "abandoned") >
        0) {
      stop = true;
      stop_reason = signal_name();
      return;
    }
    const std::vector<std::string> shares = dist::gather_strings(world.comm(), result.lines, 0);
    const std::int64_t tokens =
        dist::all_reduce(world.comm(), result.tokens, dist::ReduceOp::sum, "tokens");
    std::exception_ptr write_failure;
    if (world.is_root()) {
      try {
        const std::string text = interleave(shares, round.size(), job.num_samples);
        files->append(text);
        progress.records += static_cast<std::int64_t>(round.size());
        progress.bytes += static_cast<std::int64_t>(text.size());
        progress.completions += static_cast<std::int64_t>(round.size()) * job.num_samples;
        progress.tokens += tokens;
        files->checkpoint(progress);
      } catch (...) {
        write_failure = std::current_exception();
      }
    }
    dist::agree_on_failure(world, write_failure);
    done += static_cast<std::int64_t>(round.size());
    records_now += static_cast<std::int64_t>(round.size());
    tokens_now += tokens;
    longest_round = std::max(longest_round, round_time.seconds());
    round.clear();
  };
  std::int64_t round_bytes = 0;  // the round's output lines, estimated (the same on every rank)
  for_each_prompt_line(job.input, [&](std::string_view text, std::int64_t line) {
    if (stop || ordinal++ < done) return;
    round.emplace_back(line, std::string(text));
    round_bytes += record_output_bytes(text, job);
    if (round.size() == round_size || round_bytes >= kRoundOutputBytes) {
      run_round();
      round_bytes = 0;
    }
  });
  if (!stop && !round.empty()) run_round();
  if (stop) return stopped(stop_reason);
  std::exception_ptr finish_failure;
  if (world.is_root()) {
    try {
      files->finish();
    } catch (...) {
      finish_failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, finish_failure);
  const double seconds = time.seconds();
  context.log.info(
      "generated {} completions of {} records ({} new tokens) in {:.1f} s, {:.1f} tokens/s{}; "
      "wrote {}",
      records_now * job.num_samples, records_now, tokens_now, seconds,
      seconds > 0.0 ? static_cast<double>(tokens_now) / seconds : 0.0,
      progress.records > records_now
          ? fmt::format(" (continued: {} records in all)", progress.records)
          : std::string(),
      job.output);
  return core::kExitOk;
}

}  // namespace l3::cli
