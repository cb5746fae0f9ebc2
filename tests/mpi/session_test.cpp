// The public C++ API (include/l3/l3.hpp) as an embedding host uses it: RunConfig from arguments,
// files and setters with the CLI's checks; Sessions on sub-communicators while the other ranks
// do their own collectives (the library never touches MPI_COMM_WORLD); two sessions at once on
// disjoint communicators; create, run, destroy and create again; host-driven steps, callbacks,
// checkpoint and stop requests; errors as l3::Error with the CLI's exit codes.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catch.hpp"
#include "dist/collectives.hpp"
#include "dist/world.hpp"
#include "io/prep/prep_job.hpp"
#include "l3/l3.hpp"
#include "shared_directory.hpp"

namespace fs = std::filesystem;

namespace {

// A small reversal SFT dataset, prepared once per test (collective over `world`).
std::string make_sft_data(const l3::dist::World& world, const char* name) {
  const std::string dir = l3::test::shared_directory(world, "session", name);
  if (world.is_root()) {
    std::ofstream out(dir + "/in.jsonl");
    const char* const words[] = {"apple", "river", "stone", "cloud", "maple", "tiger"};
    for (int i = 0; i < 60; ++i) {
      const std::string word = words[i % 6];
      out << nlohmann::json{{"prompt", fmt::format("Reverse {}.", word)},
                            {"completion", std::string(word.rbegin(), word.rend())}}
                 .dump()
          << "\n";
    }
  }
  world.barrier();
  l3::prep::PrepOptions o;
  o.kind = l3::prep::DatasetKind::sft;
  o.inputs = {dir + "/in.jsonl"};
  o.tokenizer = "bytes";
  o.output = dir + "/data";
  const l3::core::Logger quiet(world.rank(), world.size(), {.level = l3::core::LogLevel::off});
  (void)l3::prep::run_prep(world, quiet, o);
  return dir;
}

// The backend: cpu, or $L3_SESSION_TEST_BACKEND (the emulated build runs these tests with cuda:
// each rank on an emulated device of its own, exchanging over NCCL, tests/CMakeLists.txt).
std::string test_backend() {
  const char* chosen = std::getenv("L3_SESSION_TEST_BACKEND");
  return chosen != nullptr && *chosen != '\0' ? chosen : "cpu";
}

l3::RunConfig tiny_run(const std::string& dir, int steps) {
  return l3::RunConfig::from_args({"sft", "--model", "tiny", "--data", dir + "/data", "--backend",
                                   test_backend(), "--seq-len", "64", "--global-batch", "4",
                                   "--steps", std::to_string(steps), "--lr", "3e-3", "--log-level",
                                   "warn", "--no-progress"});
}

int expect_error(const std::function<void()>& body) {
  try {
    body();
  } catch (const l3::Error& e) {
    INFO(e.what());
    return e.exit_code();
  }
  return 0;
}

}  // namespace

TEST_CASE("RunConfig takes the CLI's options, config files and setters, with its checks",
          "[session]") {
  const l3::dist::World world(MPI_COMM_SELF);
  const std::string dir = l3::test::shared_directory(world, "session", "config");
  l3::RunConfig config = l3::RunConfig::from_args(
      {"sft", "--model", "tiny", "--data", "d", "--global-batch", "8", "--lr", "1e-4"});
  CHECK(config.phase() == l3::Phase::sft);
  CHECK(config.get("lr") == "0.0001");
  CHECK(config.get("seq-len") == "2048");  // the CLI's default
  config.set("lr", 5e-5).set("steps", 12).set("recompute", true);
  CHECK(config.get("lr") == "5e-05");
  CHECK(config.get("steps") == "12");
  CHECK(config.get("recompute") == "true");
  CHECK(nlohmann::json::parse(config.to_json())["steps"] == 12);
  // args() gives back a command line that parses to the same configuration.
  CHECK(l3::RunConfig::from_args(config.args()).to_json() == config.to_json());
  config.set("recompute", false);
  CHECK(config.get("recompute") == "false");
  // LoRA's options, by name as on the command line.
  config.set("lora-rank", 16).set("lora-targets", "q,v").set("lora-dropout", 0.05);
  CHECK(nlohmann::json::parse(config.to_json())["lora_rank"] == 16);
  CHECK(nlohmann::json::parse(config.to_json())["lora_targets"] == "q,v");
  CHECK(expect_error([&] { config.set("lora-targets", "q,lm_head"); }) == 2);
  CHECK(expect_error([&] { config.set("lora-dropout", 1.0); }) == 2);
  // Rank 0 (full fine-tuning) would leave the LoRA options set above unused: refused, never
  // ignored, and the config stays as it was.
  CHECK(expect_error([&] { config.set("lora-rank", 0); }) == 2);
  CHECK(nlohmann::json::parse(config.to_json())["lora_rank"] == 16);
  // --init-adapter: the adapter's settings become the run's, through args() and back too.
  if (world.is_root()) {
    std::filesystem::create_directories(dir + "/adapter");
    std::ofstream(dir + "/adapter/adapter_config.json")
        << R"({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 32,)"
        << R"( "lora_dropout": 0.1, "target_modules": ["q_proj", "v_proj"]})";
  }
  world.barrier();
  {
    l3::RunConfig adapted =
        l3::RunConfig::from_args({"sft", "--model", "tiny", "--data", "d", "--global-batch", "8"});
    adapted.set("init-adapter", dir + "/adapter");
    const nlohmann::json resolved = nlohmann::json::parse(adapted.to_json());
    CHECK(resolved["lora_rank"] == 8);
    CHECK(resolved["lora_alpha"] == 32.0);
    CHECK(resolved["lora_targets"] == "q,v");
    CHECK(resolved["lora_dropout"] == 0.1);
    CHECK(l3::RunConfig::from_args(adapted.args()).to_json() == adapted.to_json());
    CHECK(expect_error([&] { adapted.set("lora-rank", 4); }) == 2);
    adapted.set("lora-rank", 8);  // the adapter's own: fine
    CHECK(nlohmann::json::parse(adapted.to_json())["lora_rank"] == 8);
  }

  {
    std::ofstream file(dir + "/reward.ini");
    file << "# a reward run\nmodel = tiny\ndata = pairs\nglobal-batch = 4\ncenter-rewards = 0.01\n";
  }
  const l3::RunConfig reward = l3::RunConfig::from_file(dir + "/reward.ini", l3::Phase::reward);
  CHECK(reward.phase() == l3::Phase::reward);
  CHECK(reward.get("center-rewards") == "0.01");
  CHECK(reward.get("global-batch") == "4");

  // DPO: the phase and its options, and what does not go with it.
  const l3::RunConfig dpo = l3::RunConfig::from_args(
      {"dpo", "--init", "ckpt", "--data", "pairs", "--global-batch", "4", "--beta", "0.25"});
  CHECK(dpo.phase() == l3::Phase::dpo);
  CHECK(dpo.get("beta") == "0.25");
  CHECK(dpo.get("loss") == "sigmoid");
  CHECK(expect_error([&] {
          (void)l3::RunConfig::from_args(
              {"dpo", "--init", "ckpt", "--data", "pairs", "--global-batch", "4", "--loss", "kto"});
        }) == 2);
  CHECK(expect_error([&] {
          (void)l3::RunConfig::from_args({"reward", "--init", "ckpt", "--data", "pairs",
                                          "--global-batch", "4", "--beta", "1"});
        }) == 2);  // a DPO option in a reward run

  // Every mistake is an l3::Error with exit code 2, and leaves the config as it was.
  const std::string before = config.to_json();
  CHECK(expect_error([&] { config.set("no-such-option", "1"); }) == 2);
  CHECK(expect_error([&] { config.set("lr", "fast"); }) == 2);
  CHECK(expect_error([&] { config.set("micro-batch", 0); }) == 2);
  CHECK(expect_error([&] { config.set("recompute", "yes"); }) == 2);
  CHECK(config.to_json() == before);
  CHECK(expect_error([] { (void)l3::RunConfig::from_args({"train", "--data", "d"}); }) == 2);
  CHECK(expect_error([] { (void)l3::RunConfig::from_args({"sft", "--model", "tiny"}); }) == 2);
  // Without --data (a DataSource may feed the session), --steps is required.
  CHECK(expect_error([] {
          (void)l3::RunConfig::from_args({"sft", "--model", "tiny", "--global-batch", "4"});
        }) == 2);
  CHECK(l3::RunConfig::from_args({"sft", "--model", "tiny", "--global-batch", "4", "--steps", "3"})
            .get("data")
            .empty());
  CHECK(expect_error([&] { (void)l3::RunConfig::from_file(dir + "/missing.ini"); }) == 2);
  CHECK(expect_error([] {
          (void)l3::RunConfig::from_args({"sft", "--model", "tiny", "--data", "d", "--global-batch",
                                          "8", "--center-rewards", "1"});
        }) == 2);  // a reward option in an SFT run
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("a session on a sub-communicator runs while the other ranks do their own collectives",
          "[session]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const std::string dir = make_sft_data(world, "subcomm");
  // Rank 0 (and 1 with four ranks) train; the others sum numbers among themselves meanwhile.
  // A library collective on MPI_COMM_WORLD would hang here: the others never join it.
  const int trainers = world.size() >= 4 ? 2 : 1;
  const bool trains = world.rank() < trainers;
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, trains ? 0 : 1, world.rank(), &half);
  if (trains) {
    l3::Session session(half, tiny_run(dir, 4));
    CHECK(session.size() == trainers);
    std::vector<double> losses;
    session.on_step([&](const l3::StepMetrics& m) { losses.push_back(m.loss); });
    const l3::RunSummary summary = session.run();
    CHECK(summary.steps == 4);
    CHECK(losses.size() == 4);
  } else {
    long total = 0;
    for (int i = 0; i < 200; ++i) {
      long mine = i;
      MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_LONG, MPI_SUM, half);
      total += mine;
    }
    int others = 0;
    MPI_Comm_size(half, &others);
    CHECK(total == 199L * 200 / 2 * others);
  }
  MPI_Comm_free(&half);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("two sessions on disjoint communicators at once, with different seeds", "[session]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  if (world.size() < 2) return;  // needs 2 ranks (runs with 2 and 4)
  const std::string dir = make_sft_data(world, "two");
  const int color = world.rank() % 2;
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, world.rank(), &half);
  {
    l3::RunConfig config = tiny_run(dir, 3);
    config.set("seed", static_cast<std::int64_t>(100 + color));
    config.set("ckpt-dir", fmt::format("{}/ckpt-{}", dir, color));
    l3::Session session(half, config);
    const l3::RunSummary summary = session.run();
    REQUIRE(summary.last_step.has_value());
    CHECK(summary.checkpoint == fmt::format("{}/ckpt-{}/step-00000003", dir, color));
    // Different seeds, different first losses: the sessions did not share anything.
    double loss = summary.last_step->loss;
    double other = 0;
    const int peer = world.rank() % 2 == 0 ? world.rank() + 1 : world.rank() - 1;
    if (peer < world.size()) {
      MPI_Sendrecv(&loss, 1, MPI_DOUBLE, peer, 7, &other, 1, MPI_DOUBLE, peer, 7, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
      CHECK(other != loss);
    }
  }
  MPI_Comm_free(&half);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("a session is created, driven step by step, destroyed and created again", "[session]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const std::string dir = make_sft_data(world, "again");
  l3::RunConfig config = tiny_run(dir, 6);
  config.set("ckpt-dir", dir + "/ckpt");
  std::vector<std::int64_t> committed;
  {
    l3::Session session(MPI_COMM_WORLD, config);
    session.on_checkpoint([&](const l3::CheckpointInfo& c) { committed.push_back(c.step); });
    int steps = 0;
    while (session.step()) {
      ++steps;
      if (steps == 2 && world.rank() == world.size() - 1) session.request_checkpoint();
      if (steps == 4) session.request_stop();  // every rank: no step after step 4
    }
    CHECK(steps == 4);
    CHECK(session.steps_done() == 4);
    CHECK(session.total_steps() == 6);
  }
  // The requested checkpoint at step 2 (one rank asked) and the stop's at step 4, both reported.
  CHECK(committed == std::vector<std::int64_t>{2, 4});
  {
    // Created again in the same process: resumes from the stop's checkpoint and finishes.
    l3::Session session(MPI_COMM_WORLD, config);
    CHECK(session.steps_done() == 4);
    const l3::RunSummary summary = session.run();
    CHECK(summary.first_step == 4);
    CHECK(summary.steps == 2);
    const l3::CheckpointInfo now = session.checkpoint();
    CHECK(now.step == 6);
    CHECK(now.directory == dir + "/ckpt/step-00000006");
  }
  {
    // An error in the constructor reaches every rank as an l3::Error, exit code 2.
    l3::RunConfig bad = tiny_run(dir, 2);
    bad.set("data", dir + "/no-such-data");
    int code = 0;
    try {
      l3::Session session(MPI_COMM_WORLD, bad);
    } catch (const l3::Error& e) {
      code = e.exit_code();
      if (world.is_root()) CHECK(std::string(e.what()).find("no-such-data") != std::string::npos);
    }
    CHECK(code == 2);
  }
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

namespace {

// Reversal documents made in memory: "w:" + word, then the reversed word as the target. Byte ids
// (the tiny model's vocabulary covers them); the same samples for the same step on every run.
class ReversalSource final : public l3::DataSource {
 public:
  explicit ReversalSource(int per_rank) : per_rank_(per_rank) {}
  void fill(std::int64_t step, int rank, int /*ranks*/, l3::StepSamples& out) override {
    ++calls;
    const char* const words[] = {"apple", "river", "stone", "cloud", "maple", "tiger"};
    for (int i = 0; i < per_rank_; ++i) {
      const std::string word = words[(step * 7 + rank * 3 + i) % 6];
      l3::SftDocument document;
      for (const char c : "w:" + word) {
        document.tokens.push_back(static_cast<unsigned char>(c));
        document.loss_mask.push_back(0);
      }
      for (auto c = word.rbegin(); c != word.rend(); ++c) {
        document.tokens.push_back(static_cast<unsigned char>(*c));
        document.loss_mask.push_back(1);
      }
      out.documents.push_back(std::move(document));
    }
  }
  int calls = 0;

 private:
  int per_rank_;
};

}  // namespace

TEST_CASE("a DataSource feeds a session from memory, and a restart continues it exactly",
          "[session]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const std::string dir = l3::test::shared_directory(world, "session", "source");
  // 8 rows per step over the ranks; each rank's documents fill its 8 / ranks rows.
  auto config = l3::RunConfig::from_args({"sft", "--model", "tiny", "--backend", "cpu", "--seq-len",
                                          "32", "--global-batch", "8", "--steps", "6", "--lr",
                                          "3e-3", "--log-level", "warn", "--no-progress"});
  const int per_rank = 8 / world.size();
  std::vector<double> straight;
  {
    auto source = std::make_shared<ReversalSource>(per_rank);
    l3::Session session(MPI_COMM_WORLD, config, source);
    session.on_step([&](const l3::StepMetrics& m) { straight.push_back(m.loss); });
    const l3::RunSummary summary = session.run();
    CHECK(summary.steps == 6);
    CHECK(source->calls == 6);
  }
  REQUIRE(straight.size() == 6);
  CHECK(straight.back() < straight.front());  // it learns from the host's data

  // Stopped after 3 steps with a checkpoint, then a new session resumes at step 3.
  config.set("ckpt-dir", dir + "/ckpt");
  std::vector<double> resumed;
  {
    l3::Session session(MPI_COMM_WORLD, config, std::make_shared<ReversalSource>(per_rank));
    session.on_step([&](const l3::StepMetrics& m) { resumed.push_back(m.loss); });
    for (int i = 0; i < 3; ++i) REQUIRE(session.step());
    session.request_stop();
    CHECK_FALSE(session.step());
  }
  {
    l3::Session session(MPI_COMM_WORLD, config, std::make_shared<ReversalSource>(per_rank));
    session.on_step([&](const l3::StepMetrics& m) { resumed.push_back(m.loss); });
    CHECK(session.run().first_step == 3);
  }
  CHECK(resumed == straight);  // bit for bit

  // Bad samples are the host's input errors (exit code 2), on every rank.
  class OutOfVocabulary final : public l3::DataSource {
    void fill(std::int64_t /*step*/, int /*rank*/, int /*ranks*/, l3::StepSamples& out) override {
      out.documents.push_back({{1, 2, 1 << 20}, {0, 1, 1}});
    }
  };
  config.set("ckpt-dir", dir + "/ckpt-bad");
  int code = 0;
  try {
    l3::Session session(MPI_COMM_WORLD, config, std::make_shared<OutOfVocabulary>());
    (void)session.run();
  } catch (const l3::Error& e) {
    code = e.exit_code();
    CHECK(std::string(e.what()).find("outside the model's vocabulary") != std::string::npos);
  }
  CHECK(code == 2);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}
