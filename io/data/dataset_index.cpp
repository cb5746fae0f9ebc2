#include "io/data/dataset_index.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "dist/communicator.hpp"
#include "io/data/shard_format.hpp"
#include "io/h5/h5.hpp"

namespace l3::data {

namespace fs = std::filesystem;
using nlohmann::json;

std::int64_t DatasetIndex::sample_tokens(std::int64_t sample) const noexcept {
  const auto i = static_cast<std::size_t>(sample);
  return length[i] + (kind == SampleKind::preference ? rejected_length[i] : 0);
}

std::int64_t DatasetIndex::total_tokens() const noexcept {
  std::int64_t total = 0;
  for (std::int64_t s = 0; s < samples(); ++s) total += sample_tokens(s);
  return total;
}

bool DatasetIndex::has_response_masks() const noexcept {
  return !shards.empty() &&
         std::ranges::all_of(shards, [](const ShardEntry& s) { return s.has_response_masks; });
}

bool DatasetIndex::has_margin() const noexcept {
  return std::ranges::any_of(shards, [](const ShardEntry& s) { return s.has_margin; });
}

namespace {

std::vector<std::int64_t> offsets_of(const h5::Handle& group, const std::string& path,
                                     const std::string& name) {
  std::vector<std::int64_t> offsets = h5::read_dataset<std::int64_t>(group, "doc_offsets", path);
  const std::int64_t tokens = h5::dataset_length(group, "tokens", path);
  if (offsets.empty() || offsets.front() != 0 || offsets.back() != tokens) {
    throw core::bad_input(fmt::format("offsets must run from 0 to the {} tokens", tokens),
                          {.file = path, .tensor = name});
  }
  for (std::size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] < offsets[i - 1]) {
      throw core::bad_input(fmt::format("offsets decrease at document {}", i - 1),
                            {.file = path, .tensor = name});
    }
    if (offsets[i] - offsets[i - 1] > std::numeric_limits<std::int32_t>::max()) {
      throw core::bad_input(fmt::format("document {} is longer than 2^31 tokens", i - 1),
                            {.file = path, .tensor = name});
    }
  }
  return offsets;
}

// Rank 0's work: read and check everything.
// A function-try-block: a field of the wrong JSON type in index.json is reported with its name.
DatasetIndex read_index(const std::string& directory, const DatasetExpectations& expect) try {
  if (directory.empty()) throw core::bad_input("the dataset directory is an empty path");
  const fs::path dir = fs::absolute(directory);
  const std::string index_path = (dir / "index.json").string();
  std::error_code exists_error;
  if (!fs::exists(index_path, exists_error)) {
    throw core::bad_input("no index.json: not a dataset directory (make one with llama3-hpc prep)",
                          {.file = dir.string()});
  }
  const json index = core::read_json_object(index_path, "a dataset index");
  DatasetIndex d;
  d.directory = dir.string();
  const std::string format = index.value("format", "");
  const std::string expected =
      std::string(expect.kind == SampleKind::sft          ? kSftFormat
                  : expect.kind == SampleKind::preference ? kPreferenceFormat
                                                          : kPromptFormat);
  if (format != expected) {
    throw core::bad_input(
        fmt::format(R"(format "{}", but this phase needs "{}")", format, expected),
        {.file = index_path});
  }
  d.kind = expect.kind;
  if (index.value("version", std::int64_t{0}) != kShardVersion) {
    throw core::bad_input(
        fmt::format("version {} is not supported", index.value("version", std::int64_t{0})),
        {.file = index_path});
  }
  const json tokenizer = index.value("tokenizer", json::object());
  d.tokenizer_sha256 = tokenizer.value("sha256", "");
  d.tokenizer_name = tokenizer.value("name", "");
  d.vocab_size = tokenizer.value("vocab_size", std::int64_t{0});
  if (d.vocab_size <= 0 || d.vocab_size > (std::int64_t{1} << 31)) {
    throw core::bad_input(
        fmt::format("tokenizer.vocab_size {} is not a vocabulary size (1 .. 2^31)", d.vocab_size),
        {.file = index_path});
  }
  if (expect.model_vocab > 0 && d.vocab_size > expect.model_vocab) {
    throw core::bad_input(fmt::format("the data's vocabulary ({}) is larger than the model's ({})",
                                      d.vocab_size, expect.model_vocab),
                          {.file = index_path});
  }
  if (!expect.model_tokenizer_sha256.empty() && !expect.ignore_tokenizer_mismatch &&
      d.tokenizer_sha256 != expect.model_tokenizer_sha256) {
    throw core::bad_input(
        fmt::format("tokenized with tokenizer {}..., the model's is {}... (use "
                    "--ignore-tokenizer-mismatch if that is intended)",
                    d.tokenizer_sha256.substr(0, 12), expect.model_tokenizer_sha256.substr(0, 12)),
        {.file = index_path});
  }
  const json shards = index.value("shards", json::array());
  if (shards.empty()) throw core::bad_input("lists no shards", {.file = index_path});

  for (const json& entry : shards) {
    ShardEntry shard;
    shard.path = (dir / entry.at("file").get<std::string>()).string();
    shard.content_xxh64 = entry.value("content_xxh64", "");
    shard.first_sample = d.samples();
    std::error_code ec;
    if (!fs::exists(shard.path, ec))
      throw core::bad_input("listed in index.json but missing", {.file = shard.path});
    const ShardAttributes a = read_shard_attributes(shard.path);
    if (a.format != expected || a.version != kShardVersion) {
      throw core::bad_input(
          fmt::format("format \"{}\" version {} does not match the dataset", a.format, a.version),
          {.file = shard.path});
    }
    if (a.vocab_size != d.vocab_size) {
      throw core::bad_input(
          fmt::format("vocab_size {} where index.json says {}", a.vocab_size, d.vocab_size),
          {.file = shard.path});
    }
    if (a.tokenizer_sha256 != d.tokenizer_sha256) {
      throw core::bad_input("tokenized with another tokenizer than the rest of the dataset",
                            {.file = shard.path});
    }
    const h5::Handle file = h5::open_file_read(shard.path);
    const auto shard_number = static_cast<std::int32_t>(d.shards.size());
    if (expect.kind == SampleKind::prompt) {
      const auto offsets = offsets_of(file, shard.path, "/doc_offsets");
      shard.samples = static_cast<std::int64_t>(offsets.size()) - 1;
      if (h5::dataset_length(file, "record_offsets", shard.path) != shard.samples + 1) {
        throw core::bad_input("one record offset per prompt (and one more) expected",
                              {.file = shard.path, .tensor = "/record_offsets"});
      }
      for (std::int64_t k = 0; k < shard.samples; ++k) {
        d.shard.push_back(shard_number);
        d.offset.push_back(offsets[static_cast<std::size_t>(k)]);
        d.length.push_back(static_cast<std::int32_t>(offsets[static_cast<std::size_t>(k) + 1] -
                                                     offsets[static_cast<std::size_t>(k)]));
      }
    } else if (expect.kind == SampleKind::sft) {
      if (h5::dataset_length(file, "loss_mask", shard.path) !=
          h5::dataset_length(file, "tokens", shard.path)) {
        throw core::bad_input("loss_mask and tokens differ in length",
                              {.file = shard.path, .tensor = "/loss_mask"});
      }
      const auto offsets = offsets_of(file, shard.path, "/doc_offsets");
      shard.samples = static_cast<std::int64_t>(offsets.size()) - 1;
      for (std::int64_t k = 0; k < shard.samples; ++k) {
        d.shard.push_back(shard_number);
        d.offset.push_back(offsets[static_cast<std::size_t>(k)]);
        d.length.push_back(static_cast<std::int32_t>(offsets[static_cast<std::size_t>(k) + 1] -
                                                     offsets[static_cast<std::size_t>(k)]));
      }
    } else {
      for (const char* group : {"chosen", "rejected"}) {
        if (!h5::exists(file, group))
          throw core::bad_input(fmt::format("missing group /{}", group), {.file = shard.path});
      }
      const h5::Handle chosen(H5Gopen2(file.get(), "chosen", H5P_DEFAULT), H5Gclose);
      const h5::Handle rejected(H5Gopen2(file.get(), "rejected", H5P_DEFAULT), H5Gclose);
      const auto c = offsets_of(chosen, shard.path, "/chosen/doc_offsets");
      const auto r = offsets_of(rejected, shard.path, "/rejected/doc_offsets");
      if (c.size() != r.size()) {
        throw core::bad_input(
            fmt::format("{} chosen and {} rejected sequences", c.size() - 1, r.size() - 1),
            {.file = shard.path});
      }
      shard.samples = static_cast<std::int64_t>(c.size()) - 1;
      shard.has_margin = h5::exists(file, "margin");
      shard.has_response_masks =
          h5::exists(file, "chosen/loss_mask") && h5::exists(file, "rejected/loss_mask");
      if (shard.has_response_masks) {
        for (const auto& [group, offsets] : {std::pair{"chosen", &c}, std::pair{"rejected", &r}}) {
          const std::string name = fmt::format("{}/loss_mask", group);
          if (h5::dataset_length(file, name.c_str(), shard.path) != offsets->back()) {
            throw core::bad_input("loss_mask and tokens differ in length",
                                  {.file = shard.path, .tensor = "/" + name});
          }
        }
      }
      if (shard.has_margin && h5::dataset_length(file, "margin", shard.path) != shard.samples) {
        throw core::bad_input("one margin per pair expected",
                              {.file = shard.path, .tensor = "/margin"});
      }
      const std::vector<float> margins =
          shard.has_margin ? h5::read_dataset<float>(file, "margin", shard.path)
                           : std::vector<float>(static_cast<std::size_t>(shard.samples), 0.0F);
      for (std::int64_t k = 0; k < shard.samples; ++k) {
        const auto i = static_cast<std::size_t>(k);
        if (!std::isfinite(margins[i])) {  // prep refuses them: a shard made otherwise
          throw core::bad_input(fmt::format("pair {}: margin {} is not finite", k, margins[i]),
                                {.file = shard.path, .tensor = "/margin"});
        }
        d.margin.push_back(margins[i]);
        d.shard.push_back(shard_number);
        d.offset.push_back(c[i]);
        d.length.push_back(static_cast<std::int32_t>(c[i + 1] - c[i]));
        d.rejected_offset.push_back(r[i]);
        d.rejected_length.push_back(static_cast<std::int32_t>(r[i + 1] - r[i]));
      }
    }
    d.shards.push_back(shard);
  }
  if (d.samples() == 0) throw core::bad_input("the dataset has no samples", {.file = index_path});
  return d;
} catch (const json::exception& e) {
  throw core::bad_input(fmt::format("not a dataset index this program reads: {}", e.what()),
                        {.file = (fs::path(directory) / "index.json").string()});
}

}  // namespace

DatasetIndex open_dataset(const dist::World& world, const std::string& directory,
                          const DatasetExpectations& expect) {
  DatasetIndex d;
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      d = read_index(directory, expect);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Every rank fails with the same message (rank 0 read it), not just rank 0.
  int failed = failure ? 1 : 0;
  dist::check_mpi(MPI_Bcast(&failed, 1, MPI_INT, 0, world.comm()), "MPI_Bcast(dataset status)");
  if (failed != 0) {
    std::string message;
    int code = core::kExitBadInput;
    if (world.is_root()) {
      const core::ErrorSummary summary = core::summarize(failure);
      message = summary.text;
      code = summary.exit_code;
    }
    message = dist::broadcast_string(world.comm(), message);
    dist::check_mpi(MPI_Bcast(&code, 1, MPI_INT, 0, world.comm()), "MPI_Bcast(dataset error)");
    if (world.is_root()) std::rethrow_exception(failure);
    throw core::Error(
        code == core::kExitInternal ? core::ErrorKind::internal : core::ErrorKind::bad_input,
        message);
  }
  // The index: scalars and shard list as JSON, the per-sample arrays raw.
  json head;
  if (world.is_root()) {
    head = {{"directory", d.directory},  {"kind", static_cast<int>(d.kind)},
            {"sha", d.tokenizer_sha256}, {"tokenizer", d.tokenizer_name},
            {"vocab", d.vocab_size},     {"shards", json::array()}};
    for (const ShardEntry& s : d.shards) {
      head["shards"].push_back(
          {s.path, s.first_sample, s.samples, s.has_margin, s.has_response_masks, s.content_xxh64});
    }
  }
  head = json::parse(
      dist::broadcast_string(world.comm(), world.is_root() ? head.dump() : std::string()));
  if (!world.is_root()) {
    d.directory = head.at("directory").get<std::string>();
    d.kind = static_cast<SampleKind>(head.at("kind").get<int>());
    d.tokenizer_sha256 = head.at("sha").get<std::string>();
    d.tokenizer_name = head.at("tokenizer").get<std::string>();
    d.vocab_size = head.at("vocab").get<std::int64_t>();
    for (const json& s : head.at("shards")) {
      d.shards.push_back({s[0].get<std::string>(), s[1].get<std::int64_t>(),
                          s[2].get<std::int64_t>(), s[3].get<bool>(), s[4].get<bool>(),
                          s[5].get<std::string>()});
    }
  }
  dist::broadcast_vector(world.comm(), d.shard);
  dist::broadcast_vector(world.comm(), d.offset);
  dist::broadcast_vector(world.comm(), d.length);
  dist::broadcast_vector(world.comm(), d.rejected_offset);
  dist::broadcast_vector(world.comm(), d.rejected_length);
  dist::broadcast_vector(world.comm(), d.margin);
  return d;
}

std::optional<SampleKind> dataset_kind(const dist::World& world, const std::string& directory) {
  int kind = -1;  // 0 sft, 1 preference
  if (world.is_root()) {
    try {
      const json index =
          core::read_json_object((fs::path(directory) / "index.json").string(), "a dataset index");
      const std::string format = index.value("format", "");
      kind = format == kSftFormat          ? 0
             : format == kPreferenceFormat ? 1
             : format == kPromptFormat     ? 2
                                           : -1;
    } catch (const std::exception&) {  // open_dataset reports it
    }
  }
  dist::check_mpi(MPI_Bcast(&kind, 1, MPI_INT, 0, world.comm()), "MPI_Bcast(dataset kind)");
  if (kind < 0) return std::nullopt;
  return static_cast<SampleKind>(kind);
}

std::vector<std::string> shard_content_digests(const dist::World& world,
                                               const DatasetIndex& index) {
  std::vector<std::string> digests;
  for (const ShardEntry& s : index.shards) digests.push_back(s.content_xxh64);
  std::exception_ptr failure;
  std::string mine;  // "i digest;" for the missing shards this rank reads
  try {
    int missing = 0;
    for (std::size_t i = 0; i < digests.size(); ++i) {
      if (!digests[i].empty()) continue;
      if (missing++ % world.size() != world.rank()) continue;
      const std::string& path = index.shards[i].path;
      const std::string digest =
          index.kind == SampleKind::sft          ? content_digest(read_sft_shard(path).documents)
          : index.kind == SampleKind::preference ? content_digest(read_preference_shard(path).pairs)
                                                 : content_digest(read_prompt_shard(path).prompts);
      mine += fmt::format("{} {};", i, digest);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  dist::agree_on_failure(world, failure);
  for (const std::string& part : dist::gather_strings(world.comm(), mine)) {
    std::size_t at = 0;
    while (at < part.size()) {
      const std::size_t space = part.find(' ', at);
      const std::size_t end = part.find(';', space);
      digests[std::stoul(part.substr(at, space - at))] = part.substr(space + 1, end - space - 1);
      at = end + 1;
    }
  }
  // gather_strings gives rank 0 every part: it tells the others.
  json all = digests;
  all = json::parse(dist::broadcast_string(world.comm(), all.dump()));
  return all.get<std::vector<std::string>>();
}

}  // namespace l3::data
