#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string_view>

#include "core/bounded_read.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "io/data/shard_format.hpp"
#include "io/h5/h5.hpp"

namespace l3::data {

void Documents::add(std::span<const std::int32_t> document, std::span<const std::uint8_t> mask) {
  for (const std::int32_t id : document) tokens.push_back(static_cast<std::uint32_t>(id));
  loss_mask.insert(loss_mask.end(), mask.begin(), mask.end());
  offsets.push_back(static_cast<std::int64_t>(tokens.size()));
}

std::int64_t Documents::loss_tokens() const noexcept {
  return std::count_if(loss_mask.begin(), loss_mask.end(), [](std::uint8_t m) { return m != 0; });
}

void Documents::clear() {
  tokens.clear();
  loss_mask.clear();
  offsets.assign(1, 0);
}

void PreferencePairs::clear() {
  chosen.clear();
  rejected.clear();
  margins.clear();
  has_margin = false;
}

void Prompts::add(std::span<const std::int32_t> prompt, std::string_view record) {
  documents.add(prompt, {});
  records.append(record);
  record_offsets.push_back(static_cast<std::int64_t>(records.size()));
}

std::string_view Prompts::record(std::int64_t d) const {
  const auto i = static_cast<std::size_t>(d);
  const auto begin = static_cast<std::size_t>(record_offsets[i]);
  return std::string_view(records).substr(begin,
                                          static_cast<std::size_t>(record_offsets[i + 1]) - begin);
}

void Prompts::clear() {
  documents.clear();
  records.clear();
  record_offsets.assign(1, 0);
}

namespace {

void write_attributes(const h5::Handle& file, const ShardAttributes& a, const std::string& path) {
  h5::write_attribute(file, "format", a.format, path);
  h5::write_attribute(file, "version", a.version, path);
  h5::write_attribute(file, "tokenizer_sha256", a.tokenizer_sha256, path);
  h5::write_attribute(file, "vocab_size", a.vocab_size, path);
}

void write_group(const h5::Handle& parent, const Documents& d, bool with_mask,
                 const std::string& path) {
  h5::write_dataset<std::uint32_t>(parent, "tokens", d.tokens, path);
  if (with_mask) h5::write_dataset<std::uint8_t>(parent, "loss_mask", d.loss_mask, path);
  h5::write_dataset<std::int64_t>(parent, "doc_offsets", d.offsets, path);
}

// Shards are written under a temporary name and renamed once complete and on disk.
template <typename Write>
void write_atomically(const std::string& path, Write&& write) {
  const std::string temporary = core::temporary_name_for(path);
  bool created = false;
  try {
    {
      const h5::Handle file = h5::create_new_file(temporary);
      created = true;
      write(file, temporary);
      h5::flush_file(file, temporary);
    }
    core::fsync_path(temporary);
    core::rename_path(temporary, path);
  } catch (...) {
    std::error_code ec;
    if (created) std::filesystem::remove(temporary, ec);  // ours; whatever was there is not
    throw;
  }
}

// Offsets start at 0, never decrease, end at the token count.
void check_offsets(const std::vector<std::int64_t>& offsets, std::int64_t tokens,
                   const std::string& path, const std::string& dataset) {
  if (offsets.empty() || offsets.front() != 0 || offsets.back() != tokens) {
    throw core::bad_input(fmt::format("offsets must run from 0 to the token count {}", tokens),
                          {.file = path, .tensor = dataset});
  }
  for (std::size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] < offsets[i - 1]) {
      throw core::bad_input(fmt::format("offsets decrease at document {}", i - 1),
                            {.file = path, .tensor = dataset});
    }
  }
}

Documents read_group(const h5::Handle& parent, bool with_mask, const std::string& path,
                     const std::string& prefix) {
  Documents d;
  d.tokens = h5::read_dataset<std::uint32_t>(parent, "tokens", path);
  if (with_mask) {
    d.loss_mask = h5::read_dataset<std::uint8_t>(parent, "loss_mask", path);
    if (d.loss_mask.size() != d.tokens.size()) {
      throw core::bad_input(fmt::format("loss_mask has {} entries for {} tokens",
                                        d.loss_mask.size(), d.tokens.size()),
                            {.file = path, .tensor = prefix + "loss_mask"});
    }
  }
  d.offsets = h5::read_dataset<std::int64_t>(parent, "doc_offsets", path);
  check_offsets(d.offsets, d.token_count(), path, prefix + "doc_offsets");
  return d;
}

void expect_format(const ShardAttributes& a, std::string_view format, const std::string& path) {
  if (a.format != format) {
    throw core::bad_input(fmt::format(R"(format is "{}", expected "{}")", a.format, format),
                          {.file = path});
  }
  if (a.version != kShardVersion) {
    throw core::bad_input(fmt::format("shard version {} is not supported (this program reads {})",
                                      a.version, kShardVersion),
                          {.file = path});
  }
}

}  // namespace

void write_sft_shard(const std::string& path, const Documents& documents,
                     const ShardAttributes& attributes) {
  write_atomically(path, [&](const h5::Handle& file, const std::string& name) {
    write_attributes(file, attributes, name);
    write_group(file, documents, true, name);
  });
}

void write_preference_shard(const std::string& path, const PreferencePairs& pairs,
                            const ShardAttributes& attributes) {
  write_atomically(path, [&](const h5::Handle& file, const std::string& name) {
    write_attributes(file, attributes, name);
    // The responses' masks when every pair has them (prep's); older readers ignore them.
    const bool masks = !pairs.chosen.loss_mask.empty() || pairs.chosen.count() == 0;
    write_group(h5::create_group(file, "chosen", name), pairs.chosen, masks, name);
    write_group(h5::create_group(file, "rejected", name), pairs.rejected, masks, name);
    if (pairs.has_margin) h5::write_dataset<float>(file, "margin", pairs.margins, name);
  });
}

void write_prompt_shard(const std::string& path, const Prompts& prompts,
                        const ShardAttributes& attributes) {
  write_atomically(path, [&](const h5::Handle& file, const std::string& name) {
    write_attributes(file, attributes, name);
    write_group(file, prompts.documents, false, name);
    const std::span<const std::uint8_t> bytes(
        reinterpret_cast<const std::uint8_t*>(prompts.records.data()), prompts.records.size());
    h5::write_dataset<std::uint8_t>(file, "records", bytes, name);
    h5::write_dataset<std::int64_t>(file, "record_offsets", prompts.record_offsets, name);
  });
}

ShardAttributes read_shard_attributes(const std::string& path) {
  const h5::Handle file = h5::open_file_read(path);
  ShardAttributes a;
  a.format = h5::read_string_attribute(file, "format", path);
  a.version = h5::read_int_attribute(file, "version", path);
  a.tokenizer_sha256 = h5::read_string_attribute(file, "tokenizer_sha256", path);
  a.vocab_size = h5::read_int_attribute(file, "vocab_size", path);
  return a;
}

SftShard read_sft_shard(const std::string& path) {
  SftShard shard;
  shard.attributes = read_shard_attributes(path);
  expect_format(shard.attributes, kSftFormat, path);
  const h5::Handle file = h5::open_file_read(path);
  shard.documents = read_group(file, true, path, "/");
  return shard;
}

PreferenceShard read_preference_shard(const std::string& path) {
  PreferenceShard shard;
  shard.attributes = read_shard_attributes(path);
  expect_format(shard.attributes, kPreferenceFormat, path);
  const h5::Handle file = h5::open_file_read(path);
  for (const char* group : {"chosen", "rejected"}) {
    if (!h5::exists(file, group))
      throw core::bad_input(fmt::format("missing group /{}", group), {.file = path});
  }
  const h5::Handle chosen(H5Gopen2(file.get(), "chosen", H5P_DEFAULT), H5Gclose);
  const h5::Handle rejected(H5Gopen2(file.get(), "rejected", H5P_DEFAULT), H5Gclose);
  const bool masks = h5::exists(chosen, "loss_mask") && h5::exists(rejected, "loss_mask");
  shard.pairs.chosen = read_group(chosen, masks, path, "/chosen/");
  shard.pairs.rejected = read_group(rejected, masks, path, "/rejected/");
  if (shard.pairs.chosen.count() != shard.pairs.rejected.count()) {
    throw core::bad_input(fmt::format("{} chosen and {} rejected sequences",
                                      shard.pairs.chosen.count(), shard.pairs.rejected.count()),
                          {.file = path});
  }
  if (h5::exists(file, "margin")) {
    shard.pairs.margins = h5::read_dataset<float>(file, "margin", path);
    shard.pairs.has_margin = true;
    if (static_cast<std::int64_t>(shard.pairs.margins.size()) != shard.pairs.count()) {
      throw core::bad_input("one margin per pair expected", {.file = path, .tensor = "/margin"});
    }
  }
  return shard;
}

PromptShard read_prompt_shard(const std::string& path) {
  PromptShard shard;
  shard.attributes = read_shard_attributes(path);
  expect_format(shard.attributes, kPromptFormat, path);
  const h5::Handle file = h5::open_file_read(path);
  Prompts& p = shard.prompts;
  p.documents = read_group(file, false, path, "/");
  const std::vector<std::uint8_t> bytes = h5::read_dataset<std::uint8_t>(file, "records", path);
  p.records.assign(bytes.begin(), bytes.end());
  p.record_offsets = h5::read_dataset<std::int64_t>(file, "record_offsets", path);
  check_offsets(p.record_offsets, static_cast<std::int64_t>(p.records.size()), path,
                "/record_offsets");
  if (p.record_offsets.size() != p.documents.offsets.size()) {
    throw core::bad_input(
        fmt::format("{} records for {} prompts", p.record_offsets.size() - 1, p.documents.count()),
        {.file = path, .tensor = "/record_offsets"});
  }
  for (std::int64_t d = 0; d < p.count(); ++d) {
    if (p.documents.offsets[static_cast<std::size_t>(d) + 1] ==
        p.documents.offsets[static_cast<std::size_t>(d)]) {
      throw core::bad_input(fmt::format("prompt {} has no tokens", d),
                            {.file = path, .tensor = "/doc_offsets"});
    }
    const std::string_view text = p.record(d);
    const nlohmann::json record = core::parse_json(
        text, "", {.file = path, .tensor = "/records", .record = std::to_string(d)});
    if (!record.is_object()) {
      throw core::bad_input(fmt::format("the record of prompt {} is not a JSON object", d),
                            {.file = path, .tensor = "/records"});
    }
  }
  return shard;
}

}  // namespace l3::data
