// The training driver across ranks: N ranks follow the 1-rank trajectory for the same global
// batch (within reduction-order tolerance), ZeRO-1 is bit-identical to unsharded AdamW, the
// overlapped reduction is bit-identical to the one after the backward pass, and checkpoints
// written at the end initialise the next phase.
#include "train/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "catch.hpp"
#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/manifest.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "dist/thread_budget.hpp"
#include "dist/world.hpp"
#include "io/prep/prep_job.hpp"
#include "model/llama_model.hpp"
#include "relative_rms.hpp"
#include "shared_directory.hpp"

namespace fs = std::filesystem;
using l3::train::Phase;
using l3::train::TrainConfig;
using l3::train::Trainer;
using nlohmann::json;

using l3::test::relative_rms;

namespace {

const char* const kWords[] = {"apple", "river", "stone", "cloud", "maple",
                              "tiger", "piano", "ocean", "lemon", "candle"};

std::string shared_directory(const l3::dist::World& world, const char* name) {
  return l3::test::shared_directory(world, "train", name);
}

// "Reverse the word X." -> X reversed; preference: the reversal against a scramble.
std::string make_dataset(const l3::dist::World& world, const std::string& dir, bool preference,
                         int records, double val_fraction = 0.0) {
  if (world.is_root()) {
    std::ofstream out(dir + "/in.jsonl");
    for (int i = 0; i < records; ++i) {
      const std::string word = kWords[(i * 7 + i / 10) % 10];
      std::string reversed(word.rbegin(), word.rend());
      std::string scrambled = word;
      std::rotate(scrambled.begin(), scrambled.begin() + 1 + i % 3, scrambled.end());
      const std::string prompt = fmt::format("Reverse the word {}.", word);
      if (preference) {
        out << json{{"prompt", prompt}, {"chosen", reversed}, {"rejected", scrambled + " ???"}}
                   .dump()
            << "\n";
      } else {
        out << json{{"prompt", prompt}, {"completion", reversed}}.dump() << "\n";
      }
    }
  }
  world.barrier();
  l3::prep::PrepOptions o;
  o.kind = preference ? l3::prep::DatasetKind::preference : l3::prep::DatasetKind::sft;
  o.inputs = {dir + "/in.jsonl"};
  o.tokenizer = "bytes";
  o.output = dir + "/data";
  o.shard_tokens = 3000;  // several shards
  o.val_fraction = val_fraction;
  o.seed = 5;
  const l3::core::Logger quiet(world.rank(), world.size(), {.level = l3::core::LogLevel::off});
  (void)l3::prep::run_prep(world, quiet, o);
  return o.output;
}

TrainConfig base_config(Phase phase, const std::string& data) {
  TrainConfig c;
  c.phase = phase;
  c.model = "tiny";
  c.data = data;
  c.backend = l3::kernels::Backend::cpu;
  c.seq_len = 128;
  c.global_batch = 12;  // divides among 1, 2, 3, 4 and 6 ranks
  c.micro_batch = 1;
  c.steps = 6;
  c.lr = 3e-3;
  c.warmup = 2;
  c.seed = 17;
  c.log_every = 0;
  c.progress = false;
  return c;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<double> norms;
  std::vector<float> weights;
  std::optional<l3::train::EvalMetrics> eval;
};

RunResult train(const l3::dist::World& world, const TrainConfig& config) {
  const l3::core::Logger quiet(world.rank(), world.size(), {.level = l3::core::LogLevel::off});
  Trainer trainer(world, quiet, config);
  RunResult r;
  trainer.on_step([&](const l3::train::StepMetrics& m) {
    r.losses.push_back(m.loss);
    r.norms.push_back(m.grad_norm);
  });
  const l3::train::TrainSummary summary = trainer.run();
  r.eval = summary.last_eval;
  r.weights = trainer.model().master_to_host();
  return r;
}

// The same run on rank 0 alone (a sub-communicator), broadcast to every rank.
RunResult train_alone(const l3::dist::World& world, const TrainConfig& config) {
  RunResult r;
  std::optional<l3::dist::World> solo = world.split(world.is_root() ? 0 : MPI_UNDEFINED, 0);
  if (solo) r = train(*solo, config);
  l3::dist::broadcast_vector(world.comm(), r.losses);
  l3::dist::broadcast_vector(world.comm(), r.norms);
  l3::dist::broadcast_vector(world.comm(), r.weights);
  return r;
}

// A run stopped after step `stop` (its checkpoint written to config.ckpt_dir), then resumed to
// the end: the losses of both parts and the final weights.
RunResult stopped_and_resumed(const l3::dist::World& world, const TrainConfig& config,
                              std::int64_t stop) {
  const l3::core::Logger quiet(world.rank(), world.size(), {.level = l3::core::LogLevel::off});
  RunResult r;
  {
    Trainer first(world, quiet, config);
    first.on_step([&](const l3::train::StepMetrics& m) {
      r.losses.push_back(m.loss);
      if (m.step == stop) first.request_stop();
    });
    (void)first.run();
  }
  REQUIRE(r.losses.size() == static_cast<std::size_t>(stop));
  Trainer second(world, quiet, config);
  second.on_step([&](const l3::train::StepMetrics& m) { r.losses.push_back(m.loss); });
  (void)second.run();
  r.weights = second.model().master_to_host();
  return r;
}

void check_close(const RunResult& many, const RunResult& one) {
  REQUIRE(many.losses.size() == one.losses.size());
  for (std::size_t s = 0; s < one.losses.size(); ++s) {
    INFO("step " << s + 1 << ": " << many.losses[s] << " vs " << one.losses[s]);
    CHECK(std::abs(many.losses[s] - one.losses[s]) <= 1e-5 * std::abs(one.losses[s]));
    CHECK(std::abs(many.norms[s] - one.norms[s]) <= 1e-4 * std::abs(one.norms[s]));
  }
  REQUIRE(many.weights.size() == one.weights.size());
  CHECK(relative_rms(many.weights, one.weights) < 1e-5);
}

}  // namespace

TEST_CASE("SFT on N ranks follows the 1-rank trajectory for the same global batch", "[train]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "sft-ranks");
  const std::string data = make_dataset(world, dir, false, 120);
  TrainConfig c = base_config(Phase::sft, data);
  c.micro_batch = world.size() <= 2 ? 2 : 1;  // accumulation on every rank count
  const RunResult many = train(world, c);
  const RunResult one = train_alone(world, c);
  INFO("ranks " << world.size());
  check_close(many, one);
  CHECK(many.losses.back() < many.losses.front());
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("reward on N ranks follows the 1-rank trajectory for the same global batch",
          "[train][reward]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "reward-ranks");
  const std::string data = make_dataset(world, dir, true, 120);
  TrainConfig c = base_config(Phase::reward, data);
  c.global_batch = 24;
  c.micro_batch = 2;
  c.center_rewards = 0.01;
  const RunResult many = train(world, c);
  const RunResult one = train_alone(world, c);
  INFO("ranks " << world.size());
  check_close(many, one);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("ZeRO-1 and overlapped reduction are bit-identical to unsharded AdamW after backward",
          "[train][zero]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "zero");
  const std::string data = make_dataset(world, dir, false, 120);
  TrainConfig c = base_config(Phase::sft, data);
  c.bucket_mb = 0.05;  // ~13k values: many buckets, uneven pieces, overlap during backward
  c.grad_clip = 0.5;   // clipping active: the norm must agree bit for bit too
  const RunResult sharded = train(world, c);
  c.shard_optimizer = false;
  c.overlap_reduction = false;
  const RunResult plain = train(world, c);
  INFO("ranks " << world.size());
  CHECK(sharded.losses == plain.losses);
  CHECK(sharded.norms == plain.norms);
  CHECK(sharded.weights == plain.weights);
  // Every rank holds the same weights after the all-gather.
  std::vector<float> root = sharded.weights;
  l3::dist::broadcast_vector(world.comm(), root);
  CHECK(root == sharded.weights);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

// The GPU's arrangement, run on the CPU: fp32 master weights in the optimizer's ZeRO-1 shards
// (the model's weights a copy refreshed by the update and all-gathered), gradients through
// host staging buffers (the MPI exchange from device memory). The same numbers bit for bit,
// and a run stopped with a checkpoint and resumed (master shards saved and loaded) as well.
TEST_CASE("master weights in optimizer shards and staged exchange are bit-identical, resumed too",
          "[train][zero]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "master-shards");
  const std::string data = make_dataset(world, dir, false, 120);
  TrainConfig c = base_config(Phase::sft, data);
  c.bucket_mb = 0.05;
  c.grad_clip = 0.5;
  const RunResult plain = train(world, c);
  c.master_in_optimizer = true;
  const RunResult master_shards = train(world, c);
  c.grad_exchange = l3::train::ExchangeChoice::mpi_staged;
  const RunResult staged = train(world, c);
  INFO("ranks " << world.size());
  CHECK(master_shards.losses == plain.losses);
  CHECK((master_shards.weights == plain.weights));
  CHECK(staged.losses == plain.losses);
  CHECK(staged.norms == plain.norms);
  CHECK((staged.weights == plain.weights));

  // Stopped after step 3 (a checkpoint of the master shards), then resumed to the end.
  c.ckpt_dir = dir + "/ckpt";
  const RunResult resumed = stopped_and_resumed(world, c, 3);
  CHECK(resumed.losses == plain.losses);
  CHECK((resumed.weights == plain.weights));
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

// ZeRO-2 through the trainer: with one micro-batch per step the same numbers as ZeRO-1 (bit for
// bit on up to two ranks, where every sum has the same two terms), with several close to them
// (each micro-batch is reduced before they are added up), and a run stopped and resumed gives the
// uninterrupted run bit for bit.
TEST_CASE("ZeRO-2 follows ZeRO-1 and resumes bit for bit", "[train][zero]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "zero2");
  const std::string data = make_dataset(world, dir, false, 120);
  TrainConfig c = base_config(Phase::sft, data);
  c.bucket_mb = 0.05;
  c.grad_clip = 0.0;  // the norm's summation order differs with the buckets
  c.micro_batch = c.global_batch / world.size();
  INFO("ranks " << world.size());
  const RunResult zero1 = train(world, c);
  c.shard_gradients = true;
  const RunResult zero2 = train(world, c);
  if (world.size() <= 2) {
    CHECK(zero2.losses == zero1.losses);
    CHECK((zero2.weights == zero1.weights));
  } else {
    check_close(zero2, zero1);
  }

  c.micro_batch = 1;
  c.grad_clip = 1.0;
  const RunResult accumulated2 = train(world, c);
  c.shard_gradients = false;
  const RunResult accumulated1 = train(world, c);
  check_close(accumulated2, accumulated1);

  c.shard_gradients = true;
  c.ckpt_dir = dir + "/ckpt";
  const RunResult resumed = stopped_and_resumed(world, c, 3);
  CHECK(resumed.losses == accumulated2.losses);
  CHECK((resumed.weights == accumulated2.weights));
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("SFT learns a synthetic task, then a reward model from its checkpoint separates pairs",
          "[train][learning]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "learning");
  fs::create_directories(dir + "/sft");
  fs::create_directories(dir + "/pref");
  world.barrier();
  const std::string sft_data = make_dataset(world, dir + "/sft", false, 300, 0.1);
  const std::string pref_data = make_dataset(world, dir + "/pref", true, 300, 0.1);

  TrainConfig c = base_config(Phase::sft, sft_data + "/train");
  c.val_data = sft_data + "/val";
  c.seq_len = 256;
  c.global_batch = 4;
  c.micro_batch = 4 / std::min(4, world.size());
  c.steps = 120;
  c.lr = 5e-3;
  c.warmup = 10;
  c.adamw.weight_decay = 0.0F;
  c.ckpt_dir = dir + "/ckpt-sft";
  c.metrics = dir + "/metrics.jsonl";
  const RunResult sft = train(world, c);
  REQUIRE(sft.eval);
  INFO("SFT: first loss " << sft.losses.front() << ", last " << sft.losses.back() << ", validation "
                          << sft.eval->loss);
  CHECK(sft.losses.front() > 4.0);  // ~ln(512) at random init
  // The prompt is free text, the answer a function of it: a model that learned the task is
  // near 0 on the answers and the template's fixed tokens.
  CHECK(sft.eval->loss < 0.5);

  if (world.is_root()) {
    const std::string step = l3::ckpt::resolve_checkpoint(c.ckpt_dir);
    CHECK(fs::path(step).filename() == "step-00000120");
    const l3::ckpt::Manifest m = l3::ckpt::read_manifest(step);
    CHECK(m.phase == "sft");
    CHECK(m.finished);
    CHECK(m.tokenizer == "bytes");
    // metrics.jsonl: one train object per step, then the eval object.
    std::ifstream in(c.metrics);
    std::string line;
    int train_lines = 0;
    int eval_lines = 0;
    while (std::getline(in, line)) {
      const json j = json::parse(line);
      if (j.at("kind") == "train") {
        ++train_lines;
        for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu",
                                "data_wait_ms", "step_ms"}) {
          CHECK(j.contains(key));
        }
      } else {
        ++eval_lines;
        CHECK(j.at("kind") == "eval");
      }
    }
    CHECK(train_lines == 120);
    CHECK(eval_lines == 1);
  }

  TrainConfig r = base_config(Phase::reward, pref_data + "/train");
  r.model.clear();
  r.init = c.ckpt_dir;  // the checkpoint root: its latest
  r.val_data = pref_data + "/val";
  r.seq_len = 256;
  r.global_batch = 8;
  r.micro_batch = 8 / std::min(8, world.size());
  r.steps = 30;
  r.lr = 1e-3;
  r.ckpt_dir = dir + "/ckpt-rm";
  const RunResult rm = train(world, r);
  REQUIRE(rm.eval);
  INFO("reward: validation accuracy " << rm.eval->accuracy << ", margin " << rm.eval->margin);
  CHECK(rm.eval->pairs > 0);
  CHECK(rm.eval->accuracy >= 0.95);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("non-finite steps are skipped and too many in a row stop the run", "[train][guard]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "guard");
  const std::string data = make_dataset(world, dir, false, 60);
  TrainConfig c = base_config(Phase::sft, data);
  c.max_bad_steps = 3;
  const l3::core::Logger quiet(world.rank(), world.size(), {.level = l3::core::LogLevel::off});
  Trainer trainer(world, quiet, c);
  // A NaN weight (as a diverged run would have) makes every loss and gradient NaN.
  const l3::kernels::TensorView weights = trainer.model().master_weights();
  const auto poisoned = static_cast<std::size_t>(trainer.model().layout().final_norm());
  weights.as<float>()[poisoned] = std::numeric_limits<float>::quiet_NaN();
  std::vector<bool> skipped;
  trainer.on_step([&](const l3::train::StepMetrics& m) { skipped.push_back(m.skipped); });
  try {
    (void)trainer.run();
    FAIL("the run should have stopped");
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::internal);
    CHECK_THAT(e.what(), Catch::Matchers::Contains("3 steps in a row"));
  }
  CHECK(skipped == std::vector<bool>{true, true, true});
  // Skipped steps leave the weights alone: the other weights are still the initial ones.
  CHECK(std::isnan(weights.as<float>()[poisoned]));
  CHECK(weights.as<float>()[poisoned + 1] == 1.0F);  // norms start at 1
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}
