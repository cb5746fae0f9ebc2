#include "io/prep/prep_job.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/bounded_read.hpp"
#include "core/build_info.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/path_safety.hpp"
#include "core/rng.hpp"
#include "core/timer.hpp"
#include "dist/collectives.hpp"
#include "io/data/shard_format.hpp"
#include "io/prep/input_split.hpp"
#include "io/tokenizer/tokenizer.hpp"

namespace l3::prep {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kMaxBadRecordWarnings = 10;

// Accumulates one split's documents on one rank and writes a shard whenever it holds
// shard_tokens tokens (and at the end).
class ShardSink {
 public:
  ShardSink(std::string dir, int rank, DatasetKind kind, data::ShardAttributes attributes,
            std::int64_t shard_tokens)
      : dir_(std::move(dir)),
        rank_(rank),
        kind_(kind),
        attributes_(std::move(attributes)),
        shard_tokens_(shard_tokens) {}

  void add(const Example& e) {
    sft_.add(e.tokens, e.mask);
    if (sft_.token_count() >= shard_tokens_) flush();
  }
  void add(const PreferenceExample& p) {
    pairs_.chosen.add(p.chosen.tokens, p.chosen.mask);
    pairs_.rejected.add(p.rejected.tokens, p.rejected.mask);
    pairs_.margins.push_back(p.margin.value_or(0.0F));
    pairs_.has_margin = pairs_.has_margin || p.margin.has_value();
    if (pairs_.chosen.token_count() + pairs_.rejected.token_count() >= shard_tokens_) flush();
  }
  void add(std::span<const std::int32_t> prompt, std::string_view record) {
    prompts_.add(prompt, record);
    if (prompts_.documents.token_count() + static_cast<std::int64_t>(prompts_.records.size()) >=
        shard_tokens_)
      flush();
  }
  void flush() {
    const std::int64_t count = kind_ == DatasetKind::sft          ? sft_.count()
                               : kind_ == DatasetKind::preference ? pairs_.count()
                                                                  : prompts_.count();
    if (count == 0) return;
    const std::string name = fmt::format("part-{:05}-{:05}.h5", rank_, written_++);
    const std::string path = (fs::path(dir_) / name).string();
    json entry = {{"file", name}};
    if (kind_ == DatasetKind::sft) {
      data::write_sft_shard(path, sft_, attributes_);
      entry["content_xxh64"] = data::content_digest(sft_);
      entry["documents"] = sft_.count();
      entry["tokens"] = sft_.token_count();
      entry["loss_tokens"] = sft_.loss_tokens();
      sft_.clear();
    } else if (kind_ == DatasetKind::prompts) {
      data::write_prompt_shard(path, prompts_, attributes_);
      entry["content_xxh64"] = data::content_digest(prompts_);
      entry["prompts"] = prompts_.count();
      entry["tokens"] = prompts_.documents.token_count();
      prompts_.clear();
    } else {
      data::write_preference_shard(path, pairs_, attributes_);
      entry["content_xxh64"] = data::content_digest(pairs_);
      entry["pairs"] = pairs_.count();
      entry["tokens"] = pairs_.chosen.token_count() + pairs_.rejected.token_count();
      entry["has_margin"] = pairs_.has_margin;
      pairs_.clear();
    }
    shards_.push_back(std::move(entry));
    core::fault_point("prep.shard", rank_);
  }
  [[nodiscard]] const json& shards() const { return shards_; }

 private:
  std::string dir_;
  int rank_;
  DatasetKind kind_;
  data::ShardAttributes attributes_;
  std::int64_t shard_tokens_;
  data::Documents sft_;
  data::PreferencePairs pairs_;
  data::Prompts prompts_;
  std::int64_t written_ = 0;
  json shards_ = json::array();
};

// The plan rank 0 makes and broadcasts: the inputs and the staging directory (created here,
// next to the output, after the output was checked: new, or a dataset of ours to replace).
json make_plan(const PrepOptions& options, std::optional<core::StagingDirectory>& staging) {
  const fs::path output = core::output_directory("--output", options.output);
  if (core::entry_exists(output)) {
    if (!options.overwrite) {
      throw core::usage_error(
          fmt::format("{} exists; choose another --output or add --overwrite (the old "
                      "dataset is replaced only once the new one is complete)",
                      options.output));
    }
    core::require_ours(output, core::OwnedKind::dataset, "--output");
  }
  const std::vector<InputFile> inputs = list_inputs(options.inputs);
  (void)core::remove_abandoned_staging(output);
  staging.emplace(output, core::OwnedKind::dataset, "--output");
  if (options.val_fraction > 0) {
    fs::create_directory(staging->path() / "train");
    fs::create_directory(staging->path() / "val");
  }
  json files = json::array();
  for (const InputFile& f : inputs)
    files.push_back({{"path", f.path}, {"size", f.size}, {"gzip", f.gzip}});
  return {{"inputs", files}, {"staging", staging->path().string()}};
}

std::string dataset_format(DatasetKind kind) {
  switch (kind) {
    case DatasetKind::sft:
      return std::string(data::kSftFormat);
    case DatasetKind::preference:
      return std::string(data::kPreferenceFormat);
    case DatasetKind::prompts:
      return std::string(data::kPromptFormat);
  }
  return {};
}

// What index.json counts the samples as.
const char* sample_noun(DatasetKind kind) {
  switch (kind) {
    case DatasetKind::sft:
      return "documents";
    case DatasetKind::preference:
      return "pairs";
    case DatasetKind::prompts:
      return "prompts";
  }
  return "samples";
}

// index.json of one dataset directory: its shards in order (rank, then number) and totals.
json make_index(const PrepOptions& options, const tokenizer::Tokenizer& tokenizer,
                const std::vector<json>& per_rank, const std::string& split, const json& stats) {
  json shards = json::array();
  std::int64_t documents = 0;
  std::int64_t tokens = 0;
  std::int64_t loss_tokens = 0;
  bool has_margin = false;
  for (const json& rank : per_rank) {
    for (const json& s : rank.at("shards").at(split)) {
      shards.push_back(s);
      documents += s.value(sample_noun(options.kind), std::int64_t{0});
      tokens += s.at("tokens").get<std::int64_t>();
      loss_tokens += s.value("loss_tokens", std::int64_t{0});
      has_margin = has_margin || s.value("has_margin", false);
    }
  }
  const core::BuildInfo build = core::build_info();
  json index = {{"format", dataset_format(options.kind)},
                {"version", data::kShardVersion},
                {"tokenizer",
                 {{"name", tokenizer.name()},
                  {"sha256", tokenizer.sha256()},
                  {"vocab_size", tokenizer.vocab_size()}}},
                {"shards", shards},
                {sample_noun(options.kind), documents},
                {"tokens", tokens},
                {"created_by", fmt::format("llama3-hpc {} ({})", build.version, build.git_commit)},
                {"source", options.inputs},
                {"stats", stats}};
  if (options.kind == DatasetKind::sft)
    index["loss_tokens"] = loss_tokens;
  else if (options.kind == DatasetKind::preference)
    index["has_margin"] = has_margin;
  if (options.val_fraction > 0) {
    index["split"] = {
        {"name", split}, {"val_fraction", options.val_fraction}, {"seed", options.seed}};
  }
  return index;
}

}  // namespace

PrepSummary run_prep(const dist::World& world, const core::Logger& log,
                     const PrepOptions& options) {
  const core::Stopwatch watch;
  // 1. Rank 0 lists the inputs and prepares the staging directory; everybody learns the plan.
  std::exception_ptr failure;
  json plan;
  std::optional<core::StagingDirectory> staging_dir;  // rank 0's; removed unless installed
  if (world.is_root()) {
    try {
      plan = make_plan(options, staging_dir);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
  plan = json::parse(
      dist::broadcast_string(world.comm(), world.is_root() ? plan.dump() : std::string()));
  const std::string staging = plan.at("staging").get<std::string>();
  std::vector<InputFile> inputs;
  for (const json& f : plan.at("inputs")) {
    inputs.push_back({f.at("path").get<std::string>(), f.at("size").get<std::int64_t>(),
                      f.at("gzip").get<bool>()});
  }
  const std::vector<std::string> splits = options.val_fraction > 0
                                              ? std::vector<std::string>{"train", "val"}
                                              : std::vector<std::string>{""};

  // 2. Every rank tokenizes its share and writes its shards.
  PrepSummary mine;
  json my_shards = json::object();
  std::optional<tokenizer::Tokenizer> tokenizer;
  try {
    tokenizer.emplace(tokenizer::Tokenizer::load(options.tokenizer));
    const RecordFormatter formatter(*tokenizer, options.format);
    const data::ShardAttributes attributes{dataset_format(options.kind), data::kShardVersion,
                                           tokenizer->sha256(), tokenizer->vocab_size()};
    std::vector<ShardSink> sinks;
    sinks.reserve(splits.size());
    for (const std::string& split : splits) {
      sinks.emplace_back((fs::path(staging) / split).string(), world.rank(), options.kind,
                         attributes, options.shard_tokens);
    }
    int warnings = 0;
    for (const FileRange& range : ranges_for_rank(inputs, world.rank(), world.size())) {
      const InputFile& input = inputs[range.file];
      mine.input_bytes += range.end - range.begin;
      const core::CounterRng split_rng(options.seed, core::RngPurpose::validation_split,
                                       static_cast<std::uint32_t>(range.file));
      for_each_line(input, range, [&](std::string_view line, std::int64_t offset) {
        if (is_blank_line(line)) return;
        ++mine.records;
        const std::size_t sink =
            options.val_fraction > 0 &&
                    split_rng.uniform(static_cast<std::uint64_t>(offset)) < options.val_fraction
                ? 1
                : 0;
        try {
          const json record = core::parse_json(line, "", {});
          Verdict verdict = Verdict::keep;
          if (options.kind == DatasetKind::sft) {
            Example example = formatter.sft(record);
            verdict = formatter.fit(example);
            if (verdict == Verdict::keep) {
              mine.tokens += static_cast<std::int64_t>(example.tokens.size());
              mine.loss_tokens += std::count(example.mask.begin(), example.mask.end(), 1);
              sinks[sink].add(example);
            }
          } else if (options.kind == DatasetKind::prompts) {
            Example prompt = formatter.prompt(record);
            const std::int64_t max_len = options.format.max_len;
            verdict = max_len > 0 && static_cast<std::int64_t>(prompt.tokens.size()) > max_len
                          ? Verdict::too_long
                          : Verdict::keep;
            if (verdict == Verdict::keep) {
              mine.tokens += static_cast<std::int64_t>(prompt.tokens.size());
              // The record as it came, its fields in their order (compact).
              sinks[sink].add(prompt.tokens, nlohmann::ordered_json::parse(line).dump());
            }
          } else {
            PreferenceExample pair = formatter.preference(record);
            verdict = formatter.fit(pair);
            if (verdict == Verdict::keep) {
              mine.tokens += static_cast<std::int64_t>(pair.chosen.tokens.size() +
                                                       pair.rejected.tokens.size());
              sinks[sink].add(pair);
            }
          }
          if (verdict == Verdict::keep) {
            ++mine.kept;
            ++(sink == 0 ? mine.train : mine.validation);
          } else {
            ++mine.dropped[std::string(verdict_name(verdict))];
          }
        } catch (core::Error& e) {
          e.add_context({.file = input.path, .line = line_number_at(input, offset)});
          if (!options.skip_bad || e.kind() == core::ErrorKind::internal) throw;
          ++mine.dropped["bad"];
          if (warnings++ < kMaxBadRecordWarnings)
            log.local(core::LogLevel::warn, "skipped: {}", e.what());
        }
      });
    }
    for (ShardSink& sink : sinks) sink.flush();
    for (std::size_t i = 0; i < splits.size(); ++i) my_shards[splits[i]] = sinks[i].shards();
  } catch (...) {
    failure = std::current_exception();
  }

  // 3. All ranks done: on any failure the staging directory goes (staging_dir's destructor),
  // the output stays as it was.
  dist::agree_on_failure(world, failure);

  // 4. Totals and shard lists to rank 0, which writes index.json and moves the dataset in.
  const json report = {{"shards", my_shards},
                       {"records", mine.records},
                       {"kept", mine.kept},
                       {"dropped", mine.dropped},
                       {"train", mine.train},
                       {"val", mine.validation},
                       {"tokens", mine.tokens},
                       {"loss_tokens", mine.loss_tokens},
                       {"input_bytes", mine.input_bytes}};
  const std::vector<std::string> gathered = dist::gather_strings(world.comm(), report.dump(), 0);
  PrepSummary total;
  json summary_json;
  failure = nullptr;
  if (world.is_root()) {
    try {
      std::vector<json> per_rank;
      per_rank.reserve(gathered.size());
      for (const std::string& text : gathered) per_rank.push_back(json::parse(text));
      for (const json& r : per_rank) {
        total.records += r.at("records").get<std::int64_t>();
        total.kept += r.at("kept").get<std::int64_t>();
        total.train += r.at("train").get<std::int64_t>();
        total.validation += r.at("val").get<std::int64_t>();
        total.tokens += r.at("tokens").get<std::int64_t>();
        total.loss_tokens += r.at("loss_tokens").get<std::int64_t>();
        total.input_bytes += r.at("input_bytes").get<std::int64_t>();
        for (const auto& [reason, count] : r.at("dropped").items())
          total.dropped[reason] += count.get<std::int64_t>();
        for (const std::string& split : splits)
          total.shards += static_cast<std::int64_t>(r.at("shards").at(split).size());
      }
      const json stats = {{"records", total.records}, {"kept", total.kept},
                          {"dropped", total.dropped}, {"train", total.train},
                          {"val", total.validation},  {"input_bytes", total.input_bytes},
                          {"ranks", world.size()}};
      for (const std::string& split : splits) {
        const fs::path dir = fs::path(staging) / split;
        core::write_file_atomically(
            (dir / "index.json").string(),
            make_index(options, *tokenizer, per_rank, split, stats).dump(2) + "\n");
      }
      // Swap the complete dataset in; an old one (with --overwrite) is removed only after.
      staging_dir->install(options.overwrite);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
  total.seconds = watch.seconds();
  return total;
}

}  // namespace l3::prep
