// The data pipeline across ranks: every document exactly once per epoch, the same global rows
// whatever the number of ranks, resuming at (epoch, step), any prefetch depth, and clear errors
// on every rank for broken datasets.
#include "io/data/data_loader.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "catch.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "dist/world.hpp"
#include "io/data/shard_format.hpp"
#include "io/prep/prep_job.hpp"
#include "shared_directory.hpp"

namespace fs = std::filesystem;
using l3::data::DataLoader;
using l3::data::LoaderConfig;
using l3::data::Position;
using nlohmann::json;

namespace {

constexpr int kDocuments = 150;

std::string shared_directory(const l3::dist::World& world, const char* name) {
  return l3::test::shared_directory(world, "loader", name);
}

// Documents "doc N" + filler of varied length (some longer than a 64-token row), through prep.
std::string make_dataset(const l3::dist::World& world, const std::string& dir,
                         bool preference = false) {
  if (world.is_root()) {
    std::ofstream out(dir + "/in.jsonl");
    for (int i = 0; i < kDocuments; ++i) {
      const std::string filler(static_cast<std::size_t>((i * 37) % 90),
                               static_cast<char>('a' + i % 26));
      if (preference) {
        out << json{{"prompt", fmt::format("doc {:05} ", i)},
                    {"chosen", fmt::format("y{}", filler.substr(0, 10))},
                    {"rejected", "n"}}
                   .dump()
            << "\n";
      } else {
        out << json{{"text", fmt::format("doc {:05} {}", i, filler)}}.dump() << "\n";
      }
    }
  }
  world.barrier();
  l3::prep::PrepOptions o;
  o.kind = preference ? l3::prep::DatasetKind::preference : l3::prep::DatasetKind::sft;
  o.inputs = {dir + "/in.jsonl"};
  o.tokenizer = "bytes";
  o.output = dir + "/data";
  o.shard_tokens = 700;  // several shards
  const l3::core::Logger quiet(world.rank(), world.size(), {.level = l3::core::LogLevel::off});
  (void)l3::prep::run_prep(world, quiet, o);
  return o.output;
}

LoaderConfig config(std::int64_t micro, int depth = 2) {
  LoaderConfig c;
  c.plan.seq_len = 64;
  c.plan.global_batch = 24;  // divides among 1, 2, 3, 4, 6 or 8 ranks
  c.plan.micro_batch = micro;
  c.plan.seed = 99;
  c.depth = depth;
  c.pad_id = 260;
  c.model_vocab = 512;
  return c;
}

// A step's rows as JSON token lists, and the document ids found in its segments.
json rows_of(const l3::data::StepData& step, std::vector<int>& doc_ids) {
  json rows = json::array();
  static const std::regex doc(R"(doc (\d{5}))");
  for (const l3::data::Batch& b : step.micro) {
    for (std::int64_t r = 0; r < b.rows; ++r) {
      rows.push_back(std::vector<std::int32_t>(b.tokens.begin() + r * b.seq_len,
                                               b.tokens.begin() + (r + 1) * b.seq_len));
    }
    for (std::size_t s = 0; s + 1 < b.cu_seqlens.size(); ++s) {
      std::string text;
      for (std::int32_t t = b.cu_seqlens[s]; t < b.cu_seqlens[s + 1]; ++t) {
        const std::int32_t id = b.tokens[static_cast<std::size_t>(t)];
        if (id < 256) text += static_cast<char>(id);
      }
      std::smatch m;
      if (std::regex_search(text, m, doc)) doc_ids.push_back(std::stoi(m[1]));
    }
  }
  return rows;
}

// All steps of epoch 0 from `start`: per step, the rows of every rank in rank order (rank 0's
// view; empty elsewhere), plus every rank's document ids.
struct Epoch {
  std::vector<json> steps;  // on rank 0: json array of all ranks' rows
  std::vector<int> docs;    // on rank 0: the ids from all ranks
};
Epoch read_epoch(const l3::dist::World& world, const l3::data::DatasetIndex& index, LoaderConfig c,
                 Position start) {
  DataLoader loader(world, index, c, start);
  const std::int64_t steps = loader.steps_in_epoch(0);
  Epoch e;
  std::vector<int> mine;
  for (std::int64_t s = start.step; s < steps; ++s) {
    const auto& step = loader.next();
    REQUIRE(step.position == Position{0, s});
    const auto gathered = l3::dist::gather_strings(world.comm(), rows_of(step, mine).dump(), 0);
    if (world.is_root()) {
      json all = json::array();
      for (const auto& g : gathered)
        for (const auto& row : json::parse(g)) all.push_back(row);
      e.steps.push_back(all);
    }
  }
  for (const auto& g : l3::dist::gather_strings(world.comm(), json(mine).dump(), 0)) {
    for (const int id : json::parse(g)) e.docs.push_back(id);
  }
  return e;
}

}  // namespace

TEST_CASE("one epoch: every document once, same rows for any world size, resume, any depth",
          "[loader]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const std::string dir = shared_directory(world, "epoch");
  const std::string data = make_dataset(world, dir);
  const auto index =
      l3::data::open_dataset(world, data, {l3::data::SampleKind::sft, 512, "", false});
  REQUIRE(index.samples() == kDocuments);
  REQUIRE(index.shards.size() >= 3);
  const std::int64_t micro = 24 / world.size();

  const Epoch full = read_epoch(world, index, config(micro), {0, 0});
  if (world.is_root()) {
    std::map<int, int> count;
    for (const int id : full.docs) ++count[id];
    CHECK(count.size() == static_cast<std::size_t>(kDocuments));
    for (const auto& [id, n] : count) CHECK(n == 1);
  }
  // the same rows on one rank alone (its own 1-rank World)
  const auto alone = world.split(world.is_root() ? 0 : MPI_UNDEFINED, 0);
  if (alone) {
    const auto alone_index =
        l3::data::open_dataset(*alone, data, {l3::data::SampleKind::sft, 512, "", false});
    const Epoch single = read_epoch(*alone, alone_index, config(8), {0, 0});
    CHECK(single.steps == full.steps);
    const Epoch deep = read_epoch(*alone, alone_index, config(4, 4), {0, 0});
    CHECK(deep.steps == full.steps);  // micro-batch size and depth do not change the rows
  }
  // collective transfers (every rank calls H5Dread for the same shards) read the same rows
  LoaderConfig collective = config(micro);
  collective.reader.collective_transfers = true;
  const Epoch together = read_epoch(world, index, collective, {0, 0});
  if (world.is_root()) CHECK(together.steps == full.steps);
  // resuming at step 3 gives exactly the rest of the epoch, on any depth
  for (const int depth : {1, 2}) {
    const Epoch resumed = read_epoch(world, index, config(micro, depth), {0, 3});
    if (world.is_root()) {
      REQUIRE(resumed.steps.size() + 3 == full.steps.size());
      CHECK(std::equal(resumed.steps.begin(), resumed.steps.end(), full.steps.begin() + 3));
    }
  }
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("preference pairs: chosen and rejected of a pair in one row, scores read at their ends",
          "[loader]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const std::string dir = shared_directory(world, "pairs");
  const std::string data = make_dataset(world, dir, true);
  const auto index =
      l3::data::open_dataset(world, data, {l3::data::SampleKind::preference, 512, "", false});
  LoaderConfig c = config(24 / world.size());
  c.plan.seq_len = 128;
  DataLoader loader(world, index, c, {0, 0});
  std::int64_t pairs = 0;
  for (std::int64_t s = 0; s < loader.steps_in_epoch(0); ++s) {
    for (const l3::data::Batch& b : loader.next().micro) {
      b.validate(512);
      for (std::size_t p = 0; p < b.chosen_last.size(); ++p) {
        ++pairs;
        CHECK(b.chosen_last[p] / b.seq_len == b.rejected_last[p] / b.seq_len);  // same row
        CHECK(b.tokens[static_cast<std::size_t>(b.chosen_last[p])] == 265);     // <|eot_id|>
        CHECK(b.tokens[static_cast<std::size_t>(b.rejected_last[p])] == 265);
      }
    }
  }
  std::int64_t total = 0;
  MPI_Allreduce(&pairs, &total, 1, MPI_INT64_T, MPI_SUM, world.comm());
  CHECK(total == kDocuments);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("broken datasets: the same clear error on every rank, no hang", "[loader]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const std::string dir = shared_directory(world, "broken");
  const std::string data = make_dataset(world, dir);
  auto message_of = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const l3::core::Error& e) {
      return e.what();
    }
    return "no error";
  };
  const l3::data::DatasetExpectations sft{l3::data::SampleKind::sft, 512, "", false};

  // token ids beyond the model's vocabulary: the reading rank names shard and sample
  {
    const auto index = l3::data::open_dataset(world, data, sft);
    LoaderConfig c = config(24 / world.size());
    c.model_vocab = 120;  // <|begin_of_text|> is 256
    DataLoader loader(world, index, c, {0, 0});
    const std::string m = message_of([&] { (void)loader.next(); });
    CHECK(m.find("token id 256 is not below the model's vocabulary size 120") != std::string::npos);
    CHECK(m.find("part-") != std::string::npos);
    CHECK(m.find("record sample") != std::string::npos);
  }
  // the wrong phase, a vocabulary larger than the model's, a tokenizer mismatch
  CHECK(message_of([&] {
          (void)l3::data::open_dataset(world, data,
                                       {l3::data::SampleKind::preference, 512, "", false});
        }).find("this phase needs \"llama3-hpc/preference\"") != std::string::npos);
  CHECK(message_of([&] {
          (void)l3::data::open_dataset(world, data, {l3::data::SampleKind::sft, 300, "", false});
        }).find("larger than the model's (300)") != std::string::npos);
  CHECK(
      message_of([&] {
        (void)l3::data::open_dataset(world, data, {l3::data::SampleKind::sft, 512, "ab12", false});
      }).find("--ignore-tokenizer-mismatch") != std::string::npos);
  CHECK(message_of([&] {
          (void)l3::data::open_dataset(world, data, {l3::data::SampleKind::sft, 512, "ab12", true});
        }) == "no error");

  // a loss mask that is not 0 or 1, then a shard whose vocabulary differs from the index's:
  // the first shard rewritten by rank 0
  world.barrier();
  std::string shard_path;
  if (world.is_root()) {
    const json index = json::parse(std::ifstream(data + "/index.json"));
    shard_path = data + "/" + index["shards"][0]["file"].get<std::string>();
  }
  shard_path = l3::dist::broadcast_string(world.comm(), shard_path);
  const l3::data::SftShard original = l3::data::read_sft_shard(shard_path);
  const auto rewrite = [&](const l3::data::Documents& documents, std::int64_t vocab) {
    world.barrier();
    if (world.is_root()) {
      l3::data::ShardAttributes attributes = original.attributes;
      attributes.vocab_size = vocab;
      l3::data::write_sft_shard(shard_path, documents, attributes);
    }
    world.barrier();
  };
  {
    l3::data::Documents odd = original.documents;
    std::fill(odd.loss_mask.begin(), odd.loss_mask.end(), std::uint8_t{7});
    rewrite(odd, original.attributes.vocab_size);
    const auto index = l3::data::open_dataset(world, data, sft);
    // The whole epoch in one step: every rank reads a sample of the rewritten shard.
    LoaderConfig c = config(24 / world.size());
    DataLoader loader(world, index, c, {0, 0});
    std::string m = "no error";
    for (int step = 0; step < 20 && m == "no error"; ++step)
      m = message_of([&] { (void)loader.next(); });
    CHECK(m.find("a loss mask is 0 or 1") != std::string::npos);
    CHECK(m.find(shard_path) != std::string::npos);
  }
  rewrite(original.documents, std::int64_t{1} << 40);
  CHECK(message_of([&] { (void)l3::data::open_dataset(world, data, sft); }) ==
        shard_path + ": vocab_size 1099511627776 where index.json says 512");
  rewrite(original.documents, original.attributes.vocab_size);

  // a truncated shard, then a deleted shard, then no index.json
  world.barrier();
  std::string first_shard;
  if (world.is_root()) {
    const json index = json::parse(std::ifstream(data + "/index.json"));
    first_shard = data + "/" + index["shards"][0]["file"].get<std::string>();
    fs::resize_file(first_shard, fs::file_size(first_shard) / 3);
  }
  first_shard = l3::dist::broadcast_string(world.comm(), first_shard);
  CHECK(message_of([&] {
          (void)l3::data::open_dataset(world, data, sft);
        }).starts_with(first_shard + ": "));
  world.barrier();
  if (world.is_root()) fs::remove(first_shard);
  CHECK(message_of([&] { (void)l3::data::open_dataset(world, data, sft); }) ==
        first_shard + ": listed in index.json but missing");
  world.barrier();
  if (world.is_root()) fs::remove(data + "/index.json");
  CHECK(message_of([&] { (void)l3::data::open_dataset(world, data, sft); }).find("no index.json") !=
        std::string::npos);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}
