// ZeRO-2 (DataParallel with shard_gradients) against ZeRO-1 on the same micro-batches: the model
// writes into the gradient window instead of a buffer of its own, every micro-batch is reduced
// group by group, and the reduced pieces add up in the optimizers. The same gradient norm and
// update (bit for bit with one micro-batch on up to two ranks, where both sum the same two
// values), including micro-batches that some ranks have no data for (their reductions must still
// match the other ranks').
//
// ZeRO-3 (shard_parameters) against ZeRO-2: the model holds no weights and reads each group
// through DataParallel's parameter window, gathered from the optimizers' master pieces; the
// same gradients, norms and weights bit for bit over two steps (the second reads the updated
// weights), on any number of ranks, with ranks that have no data for a micro-batch taking part
// in its gathers (a batch of no rows, LlamaModel::load_batch).
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "dist/thread_budget.hpp"
#include "dist/world.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/batch.hpp"
#include "model/llama_model.hpp"
#include "model/memory_plan.hpp"
#include "model/parameter_init.hpp"
#include "parallel/data_parallel.hpp"
#include "relative_rms.hpp"
#include "train/objectives/bradley_terry_loss.hpp"
#include "train/objectives/language_model_loss.hpp"
#include "train/train_config.hpp"

using l3::model::Batch;
using l3::model::HeadKind;
using l3::model::LlamaModel;
using l3::parallel::DataParallel;

using l3::test::relative_rms;

namespace {

l3::model::ModelConfig test_model(bool tied) {
  l3::model::ModelConfig c = l3::model::preset("tiny");
  c.n_layers = 3;
  c.tie_word_embeddings = tied;
  return c;
}

// Micro-batch m of this rank: random documents, or none where `skips` says so.
Batch micro_batch(const l3::dist::World& world, int m, HeadKind head, std::int64_t vocab) {
  std::mt19937 rnd(static_cast<std::uint32_t>(1000 + 37 * world.rank() + m));
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab) - 1);
  l3::model::BatchBuilder builder(2, 24, 0);
  auto tokens = [&](std::size_t n) {
    std::vector<std::int32_t> t(n);
    for (std::int32_t& x : t) x = token(rnd);
    return t;
  };
  if (head == HeadKind::reward) {
    REQUIRE(builder.add_pair(tokens(7), tokens(9)));
    REQUIRE(builder.add_pair(tokens(11), tokens(5)));
  } else {
    const std::vector<std::uint8_t> a = {0, 0, 1, 1, 1, 1, 1, 1};
    const std::vector<std::uint8_t> b = {0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    REQUIRE(builder.add(tokens(a.size()), a) >= 0);
    REQUIRE(builder.add(tokens(b.size()), b) >= 0);
  }
  return builder.finish();
}

struct Outcome {
  double norm = 0;
  std::vector<double> gradients;  // the reduced gradients, whole (gathered from their owners)
  std::vector<float> weights;     // after the update
};

enum class Zero : std::uint8_t { one, two, three };

// The master weights, whole on every rank, from the ranks that hold them.
std::vector<float> gathered_weights(const l3::dist::World& world, DataParallel& parallel,
                                    std::int64_t total) {
  std::vector<float> whole(static_cast<std::size_t>(total), 0.0F);
  const std::vector<l3::model::FlatRange> mine = parallel.optimizer().state_ranges();
  std::int64_t count = 0;
  for (const auto& r : mine) count += r.size();
  std::vector<float> values(static_cast<std::size_t>(count));
  parallel.optimizer().save_master(mine, values);
  std::size_t at = 0;
  for (const auto& r : mine) {
    std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(at), r.size(),
                whole.begin() + r.begin);
    at += static_cast<std::size_t>(r.size());
  }
  // Each value is held by one rank, zeros elsewhere: the sum is exact.
  MPI_Allreduce(MPI_IN_PLACE, whole.data(), static_cast<int>(whole.size()), MPI_FLOAT, MPI_SUM,
                world.comm());
  return whole;
}

// Every rank's reduced pieces, put together on every rank.
std::vector<double> reduced_gradients(const l3::dist::World& world, DataParallel& parallel,
                                      const LlamaModel& model) {
  std::vector<double> whole(static_cast<std::size_t>(model.layout().total()), 0.0);
  for (std::size_t b = 0; b < parallel.buckets().size(); ++b) {
    const l3::model::FlatRange p = parallel.piece(b, world.rank());
    const std::span<const float> values =
        parallel.shards_gradients()
            ? parallel.optimizer().of_bucket(b).own_gradients().as<float>()
            : model.gradients().as<float>().subspan(static_cast<std::size_t>(p.begin),
                                                    static_cast<std::size_t>(p.size()));
    REQUIRE(static_cast<std::int64_t>(values.size()) == p.size());
    std::copy(values.begin(), values.end(), whole.begin() + p.begin);
  }
  MPI_Allreduce(MPI_IN_PLACE, whole.data(), static_cast<int>(whole.size()), MPI_DOUBLE, MPI_SUM,
                world.comm());
  return whole;
}

// `steps` steps of `micro` micro-batches, rank r skipping micro-batch `skip(r)` (-1: none),
// through ZeRO-1, 2 or 3, each followed by the update.
Outcome step(const l3::dist::World& world, l3::kernels::Ops& ops, HeadKind head, bool tied,
             Zero zero, int micro, int skip, const std::string& exchange, bool overlap,
             int steps = 1) {
  const bool zero2 = zero != Zero::one;
  const bool zero3 = zero == Zero::three;
  const l3::model::ModelConfig config = test_model(tied);
  LlamaModel model(config, head, ops, {.own_gradients = !zero2, .own_parameters = !zero3});
  if (!zero3) model.initialize(7);
  l3::parallel::DataParallelConfig dp;
  dp.bucket_elements = 3000;  // several buckets per group, uneven pieces
  dp.placement = {.stage = zero3   ? l3::model::ZeroStage::parameters
                           : zero2 ? l3::model::ZeroStage::gradients
                                   : l3::model::ZeroStage::optimizer,
                  .ranks = world.size(),
                  .master_in_optimizer = zero3,
                  .fp32_gradients = true};
  dp.exchange = l3::train::parse_exchange_choice(exchange);
  dp.overlap = overlap;
  DataParallel parallel(world, ops, model.layout(), dp, {},
                        {.master = model.master_weights(), .compute = model.weight_copy()});
  if (zero3) {
    // Each rank keeps its pieces of the same initial weights; the model reads them gathered.
    std::vector<float> initial(static_cast<std::size_t>(model.layout().total()));
    l3::model::initialize_parameters(initial, model.layout(), 7);
    parallel.optimizer().load_master_from_whole(initial);
    model.set_parameter_window(parallel.parameter_window());
    CHECK(model.parameters().empty());
    // The gather slots are what the memory plan says they are.
    CHECK(parallel.gather_slot_bytes() == l3::model::gradient_slot_elements(model.layout()) * 4);
  }
  if (zero2) {
    model.set_gradient_window(parallel.gradient_window());
    // The slots are what the memory plan says they are.
    CHECK(parallel.gradient_slot_bytes() == l3::model::gradient_slot_elements(model.layout()) * 4);
    CHECK(model.gradients().empty());
  }
  Outcome out;
  std::unique_ptr<l3::train::Objective> objective;
  if (head == HeadKind::reward) {
    objective = std::make_unique<l3::train::BradleyTerryLoss>(model, 0.01);
  } else {
    objective = std::make_unique<l3::train::LanguageModelLoss>(model);
  }
  for (int s = 0; s < steps; ++s) {
    model.zero_gradients();
    parallel.begin_step(model.gradients());
    for (int m = 0; m < micro; ++m) {
      const bool last = m + 1 == micro;
      if (zero2) parallel.begin_micro_batch();
      if (last && !zero2) {
        model.set_gradient_ready_hook(
            [&](std::int64_t offset) { parallel.gradients_ready(offset); });
      }
      // The skipped micro-batch runs with no rows: ZeRO-3's gathers need this rank.
      const Batch batch =
          m != skip ? micro_batch(world, m + 10 * s, head, config.vocab_size) : Batch::none(24);
      objective->train(batch, head == HeadKind::reward ? 0.25F : 0.05F);
      if (last && !zero2) model.set_gradient_ready_hook({});
      if (zero2) parallel.end_micro_batch();
    }
    parallel.finish_reduction();
    out.gradients = reduced_gradients(world, parallel, model);
    out.norm = parallel.gradient_norm();
    parallel.update(1e-2F, 1.0F);
  }
  out.weights =
      zero3 ? gathered_weights(world, parallel, model.layout().total()) : model.master_to_host();
  return out;
}

}  // namespace

TEST_CASE("ZeRO-2 reduces what ZeRO-1 reduces, micro-batch by micro-batch", "[zero]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  l3::kernels::CpuOps ops;
  const bool tied = GENERATE(false, true);
  const HeadKind head = GENERATE(HeadKind::language_model, HeadKind::reward);
  // The communication thread (mpi with overlap), reductions on the training thread (without),
  // and the GPU's staged path (host buffers, always on the training thread).
  const auto [exchange, overlap] = GENERATE(std::pair<std::string, bool>{"mpi", true},
                                            std::pair<std::string, bool>{"mpi", false},
                                            std::pair<std::string, bool>{"mpi-staged", false});
  INFO("ranks " << world.size() << (tied ? ", tied" : ", untied") << ", "
                << (head == HeadKind::reward ? "reward" : "sft") << ", " << exchange
                << (overlap ? ", overlap" : ""));

  SECTION("one micro-batch") {
    const Outcome one = step(world, ops, head, tied, Zero::one, 1, -1, exchange, overlap);
    const Outcome two = step(world, ops, head, tied, Zero::two, 1, -1, exchange, overlap);
    CHECK(two.norm == Approx(one.norm).epsilon(1e-12));
    if (world.size() <= 2) {
      CHECK((two.gradients == one.gradients));
      CHECK((two.weights == one.weights));
    } else {
      CHECK(relative_rms(two.gradients, one.gradients) < 1e-6);
      CHECK(relative_rms(two.weights, one.weights) < 1e-4);
    }
  }
  SECTION("three micro-batches, each rank skipping one") {
    // Rank r has no data for micro-batch r % 3 (rank 3 for none): its backward never runs
    // there, and ZeRO-2 must still take part in that micro-batch's reductions.
    const int skip = world.rank() < 3 ? world.rank() : -1;
    const Outcome one = step(world, ops, head, tied, Zero::one, 3, skip, exchange, overlap);
    const Outcome two = step(world, ops, head, tied, Zero::two, 3, skip, exchange, overlap);
    CHECK(two.norm == Approx(one.norm).epsilon(1e-6));
    CHECK(relative_rms(two.gradients, one.gradients) < 1e-6);
    // AdamW's first step moves every weight by about lr whatever its gradient's size, so a
    // gradient near zero whose last bits differ can move its weight the other way: looser.
    CHECK(relative_rms(two.weights, one.weights) < 1e-4);
    // And the update moved the weights: the comparison is not between two untouched copies.
    LlamaModel fresh(test_model(tied), head, ops);
    fresh.initialize(7);
    CHECK(relative_rms(two.weights, fresh.master_to_host()) > 1e-4);
  }
}

TEST_CASE("ZeRO-3 computes ZeRO-2's steps from gathered weights bit for bit", "[zero]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  (void)l3::dist::apply_thread_budget(world);
  l3::kernels::CpuOps ops;
  // Untied and tied, SFT and reward; gathers on the training thread while reductions run on the
  // communication thread, and the GPU's staged path. Three of the eight combinations, each
  // choice in at least one (each takes about 9 s on 3 ranks sharing 2 cores).
  struct Case {
    bool tied;
    HeadKind head;
    std::string exchange;
    bool overlap;
  };
  const Case c = GENERATE(Case{false, HeadKind::language_model, "mpi", true},
                          Case{true, HeadKind::reward, "mpi", true},
                          Case{true, HeadKind::language_model, "mpi-staged", false});
  const bool tied = c.tied;
  const HeadKind head = c.head;
  const std::string& exchange = c.exchange;
  const bool overlap = c.overlap;
  INFO("ranks " << world.size() << (tied ? ", tied" : ", untied") << ", "
                << (head == HeadKind::reward ? "reward" : "sft") << ", " << exchange);
  // Three micro-batches, rank r having no data for micro-batch r (rank 3 and more for none).
  const int micro = 3;
  const int skip = world.rank() >= 3 ? -1 : world.rank();
  INFO(micro << " micro-batches, skipping " << skip);
  const Outcome two = step(world, ops, head, tied, Zero::two, micro, skip, exchange, overlap, 2);
  const Outcome three =
      step(world, ops, head, tied, Zero::three, micro, skip, exchange, overlap, 2);
  CHECK(three.norm == two.norm);
  CHECK((three.gradients == two.gradients));
  CHECK((three.weights == two.weights));
  // Two updates moved the weights: the comparison is not between two untouched copies.
  LlamaModel fresh(test_model(tied), head, ops);
  fresh.initialize(7);
  CHECK(relative_rms(three.weights, fresh.master_to_host()) > 1e-4);
}
