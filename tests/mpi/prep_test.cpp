// prep on N ranks writes the same dataset as on one rank (same documents in the same order, the
// same validation split), equal to formatting every record in input order; a bad record on any
// rank fails the whole job with file:line and leaves nothing behind.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "dist/world.hpp"
#include "io/data/shard_format.hpp"
#include "io/prep/prep_job.hpp"
#include "shared_directory.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string shared_directory(const l3::dist::World& world, const char* name) {
  return l3::test::shared_directory(world, "prep", name);
}

void write_inputs(const std::string& dir) {
  std::ofstream a(dir + "/a.jsonl");
  for (int i = 0; i < 40; ++i) {
    a << json{{"messages",
               json::array({{{"role", "user"}, {"content", fmt::format("question {}", i)}},
                            {{"role", "assistant"},
                             {"content", std::string(static_cast<std::size_t>(i % 9 + 1), 'x')}}})}}
             .dump()
      << "\n";
    if (i % 7 == 0) a << json{{"text", ""}}.dump() << "\n";  // dropped: empty
  }
  std::ofstream b(dir + "/b.jsonl");
  for (int i = 0; i < 25; ++i)
    b << json{{"prompt", fmt::format("p{}", i)}, {"completion", fmt::format("c{}", i)}}.dump()
      << "\n";
}

// All documents of a dataset directory, in index order.
std::vector<std::vector<std::uint32_t>> read_documents(const std::string& dir) {
  std::ifstream in(dir + "/index.json");
  REQUIRE(in);
  const json index = json::parse(in);
  std::vector<std::vector<std::uint32_t>> docs;
  for (const json& s : index.at("shards")) {
    const auto shard = l3::data::read_sft_shard(dir + "/" + s.at("file").get<std::string>());
    const auto& d = shard.documents;
    for (std::int64_t k = 0; k < d.count(); ++k) {
      docs.emplace_back(d.tokens.begin() + d.offsets[static_cast<std::size_t>(k)],
                        d.tokens.begin() + d.offsets[static_cast<std::size_t>(k) + 1]);
    }
  }
  return docs;
}

l3::prep::PrepOptions options_for(const std::string& dir, const std::string& output) {
  l3::prep::PrepOptions o;
  o.inputs = {dir + "/*.jsonl"};
  o.tokenizer = "bytes";
  o.output = output;
  o.shard_tokens = 300;  // many small shards
  return o;
}

}  // namespace

TEST_CASE("N ranks write the dataset one rank writes, train/val split included", "[prep]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const l3::core::Logger log(world.rank(), world.size(), {});
  const std::string dir = shared_directory(world, "same");
  if (world.is_root()) write_inputs(dir);
  world.barrier();

  for (const double val : {0.0, 0.3}) {
    INFO("val fraction " << val);
    auto all = options_for(dir, dir + fmt::format("/all-{}", val));
    all.val_fraction = val;
    const auto summary = l3::prep::run_prep(world, log, all);
    // the same on rank 0 alone
    const auto alone_world = world.split(world.is_root() ? 0 : MPI_UNDEFINED, 0);
    if (alone_world) {
      auto alone = all;
      alone.output = dir + fmt::format("/alone-{}", val);
      const l3::core::Logger alone_log(0, 1, {});
      const auto single = l3::prep::run_prep(*alone_world, alone_log, alone);
      CHECK(single.kept == summary.kept);
      CHECK(single.tokens == summary.tokens);
      CHECK(summary.records == 71);
      CHECK(summary.kept == 65);
      CHECK(summary.dropped.at("empty") == 6);
      for (const std::string& split :
           val > 0 ? std::vector<std::string>{"/train", "/val"} : std::vector<std::string>{""}) {
        INFO(split);
        const auto a = read_documents(all.output + split);
        const auto b = read_documents(alone.output + split);
        CHECK(a.size() == b.size());
        CHECK(a == b);
      }
      if (val > 0) {
        CHECK(summary.validation > 5);
        CHECK(summary.validation < 40);
        CHECK(summary.train + summary.validation == summary.kept);
      }
    }
    world.barrier();
  }
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("a bad record on any rank fails the job with file:line, nothing left behind", "[prep]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const l3::core::Logger log(world.rank(), world.size(), {.level = l3::core::LogLevel::off});
  const std::string dir = shared_directory(world, "bad");
  if (world.is_root()) {
    write_inputs(dir);
    std::ofstream(dir + "/b.jsonl", std::ios::app)
        << "{\"prompt\": \"p\"}\n";  // last line of b: bad
  }
  world.barrier();
  auto options = options_for(dir, dir + "/out");
  std::string message;
  bool peer = false;
  try {
    (void)l3::prep::run_prep(world, log, options);
  } catch (const l3::core::Error& e) {
    message = e.what();
  } catch (const l3::core::PeerFailure& e) {
    peer = true;
    CHECK(e.exit_code() == 2);
  }
  // exactly one rank (the last: it holds the end of b.jsonl) reports, the others stop quietly
  CHECK((world.rank() == world.size() - 1 ? !message.empty() : peer));
  if (!message.empty()) CHECK(message == dir + "/b.jsonl:26: missing \"completion\"");
  world.barrier();
  if (world.is_root()) {
    CHECK_FALSE(fs::exists(dir + "/out"));
    for (const auto& entry : fs::directory_iterator(dir))
      CHECK(entry.path().string().find(".partial") == std::string::npos);
  }

  // with --skip-bad it is counted and the rest is written
  options.skip_bad = true;
  const auto summary = l3::prep::run_prep(world, log, options);
  if (world.is_root()) {
    CHECK(summary.dropped.at("bad") == 1);
    CHECK(fs::exists(dir + "/out/index.json"));
  }
  // the existing output is kept unless --overwrite
  options.skip_bad = false;
  std::string exists_message;
  try {
    (void)l3::prep::run_prep(world, log, options);
  } catch (const l3::core::Error& e) {
    exists_message = e.what();
  } catch (const l3::core::PeerFailure&) {
  }
  if (world.is_root()) {
    CHECK(exists_message.find("exists") != std::string::npos);
    CHECK(fs::exists(dir + "/out/index.json"));
    fs::remove_all(dir);
  }
}
