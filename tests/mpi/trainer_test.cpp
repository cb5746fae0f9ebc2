// The training driver across ranks: N ranks follow the 1-rank trajectory for the same global
// batch (within reduction-order tolerance), ZeRO-1 is bit-identical to unsharded AdamW, the
// overlapped reduction is bit-identical to the one after the backward pass, and checkpoints
// written at the end initialise the next phase.
#include "train/trainer.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "catch.hpp"
#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/hf_export.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/model_file.hpp"
#include "ckpt/peft_adapter.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "dist/thread_budget.hpp"
#include "dist/world.hpp"
#include "io/data/dataset_index.hpp"
#include "io/prep/prep_job.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/llama_model.hpp"
#include "relative_rms.hpp"
#include "shared_directory.hpp"
#include "train/dpo_reference.hpp"
#include "train/evaluator.hpp"
#include "train/lora_checkpoint_model.hpp"
#include "train/model_source.hpp"

namespace fs = std::filesystem;
using l3::train::Phase;
using l3::train::TrainConfig;
using l3::train::Trainer;
using nlohmann::json;

using l3::test::relative_rms;

namespace {

constexpr std::int64_t kMicroAll = 0;  // one micro-batch per rank and step

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
  c.progress = l3::train::ProgressMode::never;
  return c;
}

// The weights at the end: the model's, or with sharded parameters (no rank holds them all) those
// of the final checkpoint.
std::vector<float> final_weights(Trainer& trainer, const l3::train::TrainSummary& summary) {
  // (LoRA's adapters are held whole even when the frozen model is sharded.)
  if (!trainer.config().shard_parameters || trainer.model().has_adapters())
    return trainer.model().master_to_host();
  REQUIRE(!summary.checkpoint.empty());
  const l3::model::ParameterLayout& layout = trainer.model().layout();
  std::vector<float> weights(static_cast<std::size_t>(layout.total()), 0.0F);
  l3::ckpt::read_model_file(summary.checkpoint + "/" + std::string(l3::ckpt::kModelFile), layout,
                            weights);
  return weights;
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
  r.weights = final_weights(trainer, summary);
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
// the end (with `resumed_as` when given: other sharding options, the same ckpt_dir): the losses
// of both parts and the final weights.
RunResult stopped_and_resumed(const l3::dist::World& world, const TrainConfig& config,
                              std::int64_t stop,
                              const std::optional<TrainConfig>& resumed_as = std::nullopt) {
  const l3::core::Logger quiet(world.rank(), world.size(), {.level = l3::core::LogLevel::off});
  RunResult r;
  {
    Trainer first(world, quiet, config);
    first.on_step([&](const l3::train::StepMetrics& m) {
      r.losses.push_back(m.loss);
      r.norms.push_back(m.grad_norm);
      if (m.step == stop) first.request_stop();
    });
    (void)first.run();
  }
  REQUIRE(r.losses.size() == static_cast<std::size_t>(stop));
  Trainer second(world, quiet, resumed_as ? *resumed_as : config);
  second.on_step([&](const l3::train::StepMetrics& m) {
    r.losses.push_back(m.loss);
    r.norms.push_back(m.grad_norm);
  });
  const l3::train::TrainSummary summary = second.run();
  r.weights = final_weights(second, summary);
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

// ZeRO-3 through the trainer: the weights live only in the optimizers' pieces and every layer
// group is gathered before use, which changes no number: the same losses, norms and weights as
// ZeRO-2 bit for bit (the same reductions in the same order), with one micro-batch per step or
// several, untied and tied embeddings (the lm_head reading the gathered embedding), SFT and
// reward, with an evaluation where some ranks have no batch (they join the gathers idle). A
// ZeRO-3 checkpoint resumes as ZeRO-2 on the same ranks and as ZeRO-1 on one rank.
TEST_CASE("ZeRO-3 follows ZeRO-2 bit for bit and resumes on other ranks and modes",
          "[train][zero]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "zero3");
  fs::create_directories(dir + "/sft");
  fs::create_directories(dir + "/pref");
  world.barrier();
  // 3 validation records: on 4 ranks one of them evaluates nothing.
  const std::string sft_data = make_dataset(world, dir + "/sft", false, 120, 0.025);
  const std::string pref_data = make_dataset(world, dir + "/pref", true, 60, 0.05);
  const std::string tied = dir + "/tied.json";
  if (world.is_root()) {
    l3::model::ModelConfig config = l3::model::resolve_model("tiny");
    config.tie_word_embeddings = true;
    std::ofstream(tied) << config.to_hf_json().dump(2);
  }
  world.barrier();
  INFO("ranks " << world.size());

  // Untied with one micro-batch per rank and step, tied with several.
  for (const auto& [tie, micro] :
       {std::pair<bool, std::int64_t>{false, kMicroAll}, std::pair<bool, std::int64_t>{true, 1}}) {
    {
      TrainConfig c = base_config(Phase::sft, sft_data + "/train");
      c.val_data = sft_data + "/val";
      if (tie) c.model = tied;
      c.bucket_mb = 0.05;
      c.steps = 4;
      c.micro_batch = micro == kMicroAll ? c.global_batch / world.size() : micro;
      c.shard_gradients = true;
      INFO("tied " << tie << ", micro-batch " << c.micro_batch);
      const RunResult zero2 = train(world, c);
      c.shard_parameters = true;
      c.ckpt_dir = fmt::format("{}/ckpt-{}-{}", dir, tie, micro);
      const RunResult zero3 = train(world, c);
      CHECK(zero3.losses == zero2.losses);
      CHECK(zero3.norms == zero2.norms);
      CHECK((zero3.weights == zero2.weights));
      REQUIRE(zero3.eval);
      REQUIRE(zero2.eval);
      CHECK(zero3.eval->loss == zero2.eval->loss);
      CHECK(zero3.eval->tokens == zero2.eval->tokens);
    }
  }

  TrainConfig r = base_config(Phase::reward, pref_data + "/train");
  r.val_data = pref_data + "/val";
  r.global_batch = 4;
  r.micro_batch = 1;
  r.steps = 3;
  r.shard_gradients = true;
  const RunResult reward2 = train(world, r);
  r.shard_parameters = true;
  r.ckpt_dir = dir + "/ckpt-reward";
  const RunResult reward3 = train(world, r);
  CHECK(reward3.losses == reward2.losses);
  CHECK((reward3.weights == reward2.weights));
  REQUIRE(reward3.eval);
  CHECK(reward3.eval->accuracy == reward2.eval->accuracy);
  CHECK(reward3.eval->loss == reward2.eval->loss);

  // Stopped with a ZeRO-3 checkpoint after step 3, resumed as ZeRO-2 on the same ranks.
  TrainConfig c = base_config(Phase::sft, sft_data + "/train");
  c.shard_gradients = true;
  c.micro_batch = 1;
  const RunResult reference = train(world, c);
  c.shard_parameters = true;
  c.ckpt_dir = dir + "/ckpt-resume";
  TrainConfig as_zero2 = c;
  as_zero2.shard_parameters = false;
  const RunResult resumed = stopped_and_resumed(world, c, 3, as_zero2);
  CHECK(resumed.losses == reference.losses);
  CHECK((resumed.weights == reference.weights));

  // And the same checkpoint (step 3) resumed on rank 0 alone as ZeRO-1: the 1-rank sums differ
  // from the N-rank ones by rounding only.
  TrainConfig alone = base_config(Phase::sft, sft_data + "/train");
  alone.micro_batch = 1;
  alone.ckpt_dir = dir + "/ckpt-alone";
  alone.resume = l3::train::parse_resume_choice(c.ckpt_dir + "/step-00000003");
  RunResult rest = train_alone(world, alone);
  REQUIRE(rest.losses.size() == 3);
  RunResult tail = reference;
  tail.losses.erase(tail.losses.begin(), tail.losses.begin() + 3);
  tail.norms.erase(tail.norms.begin(), tail.norms.begin() + 3);
  check_close(rest, tail);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

// Hybrid sharding on 4 ranks as 2 shard groups of 2: the same trajectory as ZeRO-3 over all 4
// (each gradient summed as two group sums instead of one sum of four: close, not bit for bit),
// the groups' weights identical, and its checkpoint (written by the first group) resumed
// without hybrid sharding follows it.
TEST_CASE("ZeRO-3 with hybrid shard groups follows ZeRO-3 over all ranks", "[train][zero]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "hybrid");
  const std::string data = make_dataset(world, dir, false, 120);
  TrainConfig c = base_config(Phase::sft, data);
  c.bucket_mb = 0.05;
  c.micro_batch = 1;
  c.steps = 4;
  c.shard_gradients = true;
  c.shard_parameters = true;
  c.shard_group_size = 3;
  if (world.size() == 4) {
    // Usage errors before any work: 3 does not divide 4.
    CHECK_THROWS_AS(train(world, c), l3::core::Error);
  }
  if (world.size() != 4) {
    world.barrier();
    if (world.is_root()) fs::remove_all(dir);
    return;  // hybrid groups need 4 ranks here (2 x 2)
  }
  c.shard_group_size = 0;
  c.ckpt_dir = dir + "/flat";
  const RunResult flat = train(world, c);
  c.shard_group_size = 2;
  c.ckpt_dir = dir + "/hybrid";
  const RunResult hybrid = train(world, c);
  check_close(hybrid, flat);
  // Stopped at step 2 and resumed without hybrid sharding from the first group's checkpoint: the
  // losses after the restart follow the hybrid run's, which the second group's weights took part
  // in (a group that drifted apart would show there).
  TrainConfig resumed_flat = c;
  resumed_flat.shard_group_size = 0;
  c.ckpt_dir = dir + "/hybrid-stopped";
  resumed_flat.ckpt_dir = c.ckpt_dir;
  const RunResult resumed = stopped_and_resumed(world, c, 2, resumed_flat);
  REQUIRE(resumed.losses.size() == hybrid.losses.size());
  for (std::size_t s = 0; s < 2; ++s) CHECK(resumed.losses[s] == hybrid.losses[s]);
  check_close(resumed, hybrid);
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
    CHECK(m.phase == l3::Phase::sft);
    CHECK(m.finished);
    CHECK(m.tokenizer == "bytes");
    // metrics.jsonl: one train object per step, then the eval object.
    std::ifstream in(c.metrics);
    std::string line;
    int train_lines = 0;
    int eval_lines = 0;
    int run_lines = 0;
    int checkpoint_lines = 0;
    while (std::getline(in, line)) {
      const json j = json::parse(line);
      if (j.at("kind") == "train") {
        ++train_lines;
        for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu",
                                "data_wait_ms", "step_ms"}) {
          CHECK(j.contains(key));
        }
      } else if (j.at("kind") == "run") {
        ++run_lines;
        CHECK(j.at("phase") == "sft");
        CHECK(j.at("step") == 0);
        CHECK(j.at("ranks") == world.size());
        CHECK(j.at("resumed") == false);
      } else if (j.at("kind") == "checkpoint") {
        ++checkpoint_lines;
        CHECK(j.at("level") == "global");
      } else {
        ++eval_lines;
        CHECK(j.at("kind") == "eval");
      }
    }
    CHECK(train_lines == 120);
    CHECK(eval_lines == 1);
    CHECK(run_lines == 1);
    CHECK(checkpoint_lines >= 1);
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

// DPO's stored reference table: read back only when it is the run's (keys), whole (its values'
// checksum) and made of log-probabilities (finite, <= 0); anything else is "why" it is not used.
// Its directory must be a real one, never a link or a file.
TEST_CASE("a stored DPO reference table is used only when its checksum and values hold",
          "[train][dpo]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const std::string dir = shared_directory(world, "reference");
  const std::string path = dir + "/train.h5";
  const l3::train::ReferenceKey key{.data_xxh64 = "d", .model_xxh64 = "m", .mean = false};
  const std::vector<double> chosen{-1.5, -2.25, -0.125};
  const std::vector<double> rejected{-3.0, -0.5, -4.75};
  const auto read = [&](std::string& why) {
    return l3::train::read_reference(world, path, key, 3, why);
  };
  l3::train::check_reference_directory(world, dir, "--reference-dir");
  l3::train::write_reference(world, path, l3::train::ReferenceTable(key, chosen, rejected));
  std::string why;
  const std::optional<l3::train::ReferenceTable> good = read(why);
  REQUIRE(good);
  CHECK(std::vector<double>(good->chosen().begin(), good->chosen().end()) == chosen);
  CHECK(std::vector<double>(good->rejected().begin(), good->rejected().end()) == rejected);

  // Values that cannot be log-probabilities, stored with a checksum that matches them.
  for (const double bad : {0.5, std::numeric_limits<double>::quiet_NaN(), -1.0 / 0.0}) {
    std::vector<double> values = rejected;
    values[1] = bad;
    l3::train::write_reference(world, path, l3::train::ReferenceTable(key, chosen, values));
    std::string bad_why;
    CHECK_FALSE(read(bad_why));
    CHECK_THAT(bad_why, Catch::Matchers::Contains("its rejected value of pair 1 is") &&
                            Catch::Matchers::Contains("not a log-probability"));
  }

  // Good values changed in the file after they were written: the checksum says so.
  l3::train::write_reference(world, path, l3::train::ReferenceTable(key, chosen, rejected));
  world.barrier();
  if (world.is_root()) {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(file >= 0);
    const hid_t set = H5Dopen2(file, "chosen", H5P_DEFAULT);
    std::vector<double> changed = chosen;
    changed[0] = -1.25;  // still a log-probability
    REQUIRE(H5Dwrite(set, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, changed.data()) >= 0);
    H5Dclose(set);
    H5Fclose(file);
  }
  world.barrier();
  std::string changed_why;
  CHECK_FALSE(read(changed_why));
  CHECK_THAT(changed_why, Catch::Matchers::Contains("do not match their checksum"));

  // The directory: a link or a file is refused before anything is computed.
  world.barrier();
  if (world.is_root()) {
    fs::create_directory_symlink(dir, dir + "-link");
    std::ofstream(dir + "-file") << "x";
  }
  world.barrier();
  for (const std::string& bad : {dir + "-link", dir + "-file"}) {
    // Rank 0 checks and reports (an Error naming it); the others stop with its failure.
    if (world.is_root()) {
      CHECK_THROWS_AS(l3::train::check_reference_directory(world, bad, "--reference-dir"),
                      l3::core::Error);
    } else {
      CHECK_THROWS_AS(l3::train::check_reference_directory(world, bad, "--reference-dir"),
                      l3::core::PeerFailure);
    }
  }
  world.barrier();
  if (world.is_root()) {
    fs::remove(dir + "-link");
    fs::remove(dir + "-file");
    fs::remove_all(dir);
  }
}

// LoRA through the trainer: the model's weights frozen (they end as they began), the adapters
// trained over N ranks as over one, the first step's loss that of full fine-tuning from the same
// weights (B starts at 0); a run with dropout stopped and resumed ends bit for bit as the
// uninterrupted one; the checkpoint holds the adapters and names its base, which resuming
// checks (another model at that path is refused), and a run with other LoRA settings or none
// does not resume it.
TEST_CASE("LoRA trains adapters on a frozen model, resumes bit for bit and checks its base",
          "[train][lora]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "lora");
  const std::string data = make_dataset(world, dir, false, 120);
  // The base: a short full fine-tuning run, exported as a Hugging Face model (fp32).
  TrainConfig base = base_config(Phase::sft, data);
  base.steps = 2;
  base.ckpt_dir = dir + "/base";
  base.checkpoint_every = 1;  // step 1: another model, for the base check below
  (void)train(world, base);
  if (world.is_root()) {
    (void)l3::ckpt::export_hugging_face(dir + "/base", dir + "/hf", {.bf16 = false});
  }
  world.barrier();

  TrainConfig c = base_config(Phase::sft, data);
  c.model.clear();
  c.init = dir + "/hf";
  c.lora.rank = 4;
  c.lora.alpha = 8.0;
  c.lora.targets = l3::model::parse_lora_targets("q,v,o,down");
  c.lr = 1e-2;
  INFO("ranks " << world.size());
  const RunResult many = train(world, c);
  const RunResult one = train_alone(world, c);
  check_close(many, one);
  TrainConfig full = c;
  full.lora = {};
  const RunResult full_run = train(world, full);
  CHECK(many.losses.front() == full_run.losses.front());  // untrained adapters change nothing
  CHECK(many.losses.back() < many.losses.front());
  {
    const l3::core::Logger quiet(world.rank(), world.size(), {.level = l3::core::LogLevel::off});
    Trainer trainer(world, quiet, c);
    const auto before = trainer.model().parameters().as<float>();
    const std::vector<float> frozen(before.begin(), before.end());
    (void)trainer.run();
    const auto after = trainer.model().parameters().as<float>();
    CHECK(std::equal(after.begin(), after.end(), frozen.begin(), frozen.end()));
    CHECK(trainer.model().trainable_layout().adapters());
  }

  // --shard-parameters shards the frozen model (each rank holds 1/N, gathered group by group):
  // the same run as ZeRO-2 over the adapters, bit for bit, and its checkpoint resumes unsharded.
  TrainConfig zero2 = c;
  zero2.shard_gradients = true;
  const RunResult adapters_zero2 = train(world, zero2);
  TrainConfig sharded = zero2;
  sharded.shard_parameters = true;
  CHECK(train(world, sharded).losses == adapters_zero2.losses);
  sharded.ckpt_dir = dir + "/lora-sharded";
  TrainConfig unsharded_resume = zero2;
  unsharded_resume.ckpt_dir = sharded.ckpt_dir;
  const RunResult across = stopped_and_resumed(world, sharded, 3, unsharded_resume);
  CHECK(across.losses == adapters_zero2.losses);
  CHECK((across.weights == adapters_zero2.weights));

  // Dropout, stopped after step 3 and resumed: the same masks, the same end.
  c.lora.dropout = 0.2;
  const RunResult straight = train(world, c);
  c.ckpt_dir = dir + "/lora";
  const RunResult resumed = stopped_and_resumed(world, c, 3);
  CHECK(resumed.losses == straight.losses);
  CHECK((resumed.weights == straight.weights));
  const l3::ckpt::Manifest m = l3::ckpt::read_manifest(dir + "/lora/step-00000006");
  REQUIRE(m.lora);
  CHECK(m.lora->rank == 4);
  CHECK(m.lora->targets_text() == "q,v,o,down");
  CHECK(m.base.ends_with("/hf"));
  CHECK(m.base_xxh64.size() == 16);
  CHECK(m.tensors.size() == m.layout().tensors().size());
  CHECK(m.tensors[0].value("name", "") == "model.layers.0.self_attn.q_proj.lora_A.weight");

  // Resuming with other LoRA settings, or none, is refused; so is another model at the base's
  // path (the base run's first checkpoint exported over it).
  TrainConfig other = c;
  other.steps = 8;
  other.lora.rank = 8;
  CHECK_THROWS_WITH(
      Trainer(world,
              l3::core::Logger(world.rank(), world.size(), {.level = l3::core::LogLevel::off}),
              other),
      Catch::Contains("holds LoRA adapters of rank 4 on q,v,o,down; this run would "
                      "train LoRA adapters of rank 8"));
  other.lora = {};
  CHECK_THROWS_WITH(
      Trainer(world,
              l3::core::Logger(world.rank(), world.size(), {.level = l3::core::LogLevel::off}),
              other),
      Catch::Contains("the weights of full fine-tuning"));
  if (world.is_root()) {
    (void)l3::ckpt::export_hugging_face(dir + "/base/step-00000001", dir + "/hf",
                                        {.bf16 = false, .overwrite = true});
  }
  world.barrier();
  other = c;
  other.steps = 8;
  CHECK_THROWS_WITH(
      Trainer(world,
              l3::core::Logger(world.rank(), world.size(), {.level = l3::core::LogLevel::off}),
              other),
      Catch::Contains("is not the one these adapters were trained on"));
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

TEST_CASE("LoRA checkpoints read as models: merged export, PEFT restart, a reward run on top",
          "[train][lora]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  const std::string dir = shared_directory(world, "lora-merge");
  const std::string data = make_dataset(world, dir, false, 96);
  if (world.is_root()) fs::create_directories(dir + "/pairs");
  world.barrier();
  const std::string pairs = make_dataset(world, dir + "/pairs", true, 48);
  // The base this time is a checkpoint (the other LoRA test's is a Hugging Face directory).
  TrainConfig base = base_config(Phase::sft, data);
  base.steps = 2;
  base.ckpt_dir = dir + "/base";
  (void)train(world, base);

  TrainConfig c = base_config(Phase::sft, data);
  c.model.clear();
  c.init = dir + "/base";
  c.val_data = data;
  c.steps = 4;
  c.lr = 1e-2;
  c.lora.rank = 4;
  c.lora.alpha = 16.0;
  c.ckpt_dir = dir + "/lora";
  const RunResult adapted = train(world, c);
  REQUIRE(adapted.eval);
  const std::string step_dir = dir + "/lora/step-00000004";
  const l3::ckpt::Manifest m = l3::ckpt::read_manifest(step_dir);
  REQUIRE(m.lora);
  CHECK(m.base == fs::absolute(dir + "/base/step-00000002").lexically_normal().string());

  // The checkpoint read as a model (the base with the adapters folded in) equals its merged
  // fp32 export bit for bit, and evaluates as the adapter model did (within 1e-5).
  const l3::model::ParameterLayout layout(m.model, m.head);
  std::vector<float> merged(static_cast<std::size_t>(layout.total()), 0.0F);
  l3::train::read_initial_weights(l3::train::resolve_model_source("", dir + "/lora"), layout,
                                  merged);
  if (world.is_root()) {
    l3::train::LoraCheckpointModel model(l3::train::resolve_model_source("", step_dir));
    (void)l3::ckpt::export_hugging_face(
        m, step_dir,
        [&](const l3::model::TensorInfo& t, std::span<float> out) { model.read(t, out); },
        dir + "/merged", {.bf16 = false});
  }
  world.barrier();
  std::vector<float> exported(merged.size(), 0.0F);
  l3::train::read_initial_weights(l3::train::resolve_model_source("", dir + "/merged"), layout,
                                  exported);
  CHECK((exported == merged));
  {
    // What a rank of a sharded reader gets (its range of the layout, the base checked by the
    // ranks together) is the same values.
    const std::int64_t per = (layout.total() + world.size() - 1) / world.size();
    const l3::model::FlatRange mine{std::min(layout.total(), per * world.rank()),
                                    std::min(layout.total(), per * (world.rank() + 1))};
    const std::vector<float> share = l3::train::initial_weights_of_ranges(
        world, layout, l3::train::resolve_model_source("", dir + "/lora"), 0, {mine});
    CHECK(std::equal(share.begin(), share.end(), merged.begin() + mine.begin));
  }
  {
    l3::kernels::CpuOps ops;
    l3::model::LlamaModel plain(m.model, l3::model::HeadKind::language_model, ops,
                                {.own_gradients = false});
    (void)l3::train::initialize_model(world, plain,
                                      l3::train::resolve_model_source("", dir + "/merged"), 0);
    const l3::data::DatasetIndex index = l3::data::open_dataset(
        world, data, {.kind = l3::data::SampleKind::sft, .model_vocab = m.model.vocab_size});
    const l3::train::EvalMetrics e =
        l3::train::evaluate(world, plain, index, {.seq_len = c.seq_len, .micro_batch = 1});
    CHECK(std::abs(e.loss - adapted.eval->loss) <= 1e-5);
    CHECK(e.tokens == adapted.eval->tokens);
  }

  // Its adapters as a PEFT directory start a new run exactly where the checkpoint ended.
  if (world.is_root()) {
    const std::vector<float> values = l3::train::read_checkpoint_adapters(m, step_dir);
    l3::ckpt::write_peft_adapter(dir + "/peft", m.layout(), values, {});
  }
  world.barrier();
  {
    TrainConfig restart = c;
    restart.init_adapter = dir + "/peft";
    restart.ckpt_dir = dir + "/restart";
    const l3::core::Logger quiet(world.rank(), world.size(), {.level = l3::core::LogLevel::off});
    Trainer trainer(world, quiet, restart);
    CHECK((trainer.model().master_to_host() == l3::train::read_checkpoint_adapters(m, step_dir)));
    TrainConfig reward_adapter = restart;
    reward_adapter.phase = Phase::reward;
    reward_adapter.data = pairs;
    reward_adapter.val_data.clear();
    CHECK_THROWS_WITH(Trainer(world, quiet, reward_adapter),
                      Catch::Contains("a CAUSAL_LM adapter (language model) cannot start a "
                                      "reward run"));
  }

  // A LoRA reward run on the LoRA SFT checkpoint: its base is that checkpoint, merged.
  TrainConfig reward = base_config(Phase::reward, pairs);
  reward.model.clear();
  reward.init = dir + "/lora";
  reward.steps = 2;
  reward.global_batch = 4;
  reward.lora.rank = 2;
  reward.shard_gradients = true;
  reward.ckpt_dir = dir + "/reward";
  const RunResult rewarded = train(world, reward);
  CHECK(std::isfinite(rewarded.losses.back()));
  TrainConfig reward_sharded = reward;  // the merged LoRA SFT model sharded over the ranks
  reward_sharded.shard_parameters = true;
  reward_sharded.ckpt_dir = dir + "/reward-sharded";
  const RunResult rewarded_sharded = train(world, reward_sharded);
  CHECK(rewarded_sharded.losses == rewarded.losses);
  CHECK((rewarded_sharded.weights == rewarded.weights));
  CHECK(l3::ckpt::read_manifest(dir + "/reward-sharded/step-00000002").base_xxh64 ==
        l3::ckpt::read_manifest(dir + "/reward/step-00000002").base_xxh64);
  const l3::ckpt::Manifest rm = l3::ckpt::read_manifest(dir + "/reward/step-00000002");
  CHECK(rm.base == fs::absolute(step_dir).lexically_normal().string());
  CHECK(rm.head == l3::model::HeadKind::reward);
  std::vector<float> reward_model(
      static_cast<std::size_t>(l3::model::ParameterLayout(rm.model, rm.head).total()), 0.0F);
  l3::train::read_initial_weights(l3::train::resolve_model_source("", dir + "/reward"),
                                  l3::model::ParameterLayout(rm.model, rm.head), reward_model);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}
