// ZeRO-2 on the CUDA backend: each micro-batch's bf16 gradients, once reduced, are added into
// the optimizers' fp32 shard (AdamW::own_gradients), so the micro-batches of a step add up
// without a bf16 rounding each. ZeRO-1's whole bf16 gradient buffer takes one rounding per
// micro-batch instead (each GEMM adds into it and rounds once). The reference is exact: the same
// micro-batches' gradients computed one at a time (bf16 values, which fp64 holds exactly),
// summed in fp64. One rank: the reduction is the identity and only the accumulation differs.
#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "catch.hpp"
#include "dist/world.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "model/batch.hpp"
#include "model/llama_model.hpp"
#include "parallel/data_parallel.hpp"
#include "relative_rms.hpp"
#include "train/objectives/language_model_loss.hpp"

using l3::kernels::ConstTensorView;
using l3::kernels::TensorView;
using l3::model::Batch;
using l3::model::HeadKind;
using l3::model::LlamaModel;

namespace {

Batch micro_batch(int m, std::int64_t vocab) {
  std::mt19937 rnd(static_cast<std::uint32_t>(500 + m));
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab) - 1);
  l3::model::BatchBuilder builder(2, 32, 0);
  for (const std::size_t length : {std::size_t{29}, std::size_t{17}}) {
    std::vector<std::int32_t> tokens(length);
    for (std::int32_t& t : tokens) t = token(rnd);
    std::vector<std::uint8_t> mask(length, 1);
    mask[0] = 0;
    REQUIRE(builder.add(tokens, mask) >= 0);
  }
  return builder.finish();
}

std::vector<double> to_host(l3::kernels::Ops& ops, ConstTensorView x) {
  std::vector<float> host(static_cast<std::size_t>(x.numel()));
  ops.copy(TensorView(std::span<float>(host)), x);
  return {host.begin(), host.end()};
}

// The exact sum of the micro-batches' gradients, each computed alone into the model's zeroed
// buffer (whose values fp64 holds exactly), summed in fp64.
std::vector<double> exact_sum(l3::kernels::Ops& ops, LlamaModel& model,
                              const std::vector<Batch>& batches, float scale) {
  std::vector<double> sum(static_cast<std::size_t>(model.layout().total()), 0.0);
  for (const Batch& b : batches) {
    model.zero_gradients();
    l3::train::LanguageModelLoss(model).train(b, scale);
    const std::vector<double> g = to_host(ops, model.gradients());
    for (std::size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
  }
  return sum;
}

}  // namespace

TEST_CASE("ZeRO-2 on the GPU adds a step's micro-batches up in fp32", "[gpu][zero]") {
  const l3::dist::World world(MPI_COMM_SELF);
  l3::cuda::CudaOps ops;
  l3::model::ModelConfig config = l3::model::preset("tiny");
  config.n_layers = 2;
  config.tie_word_embeddings = false;
  constexpr int kMicro = 8;
  constexpr float kScale = 1.0F / 256;  // the loss tokens of the step, about
  std::vector<Batch> batches;
  for (int m = 0; m < kMicro; ++m) batches.push_back(micro_batch(m, config.vocab_size));

  // The exact sum of the micro-batches' bf16 gradients, each computed into a zeroed buffer.
  LlamaModel single(config, HeadKind::language_model, ops);
  single.initialize(7);
  const std::vector<double> exact = exact_sum(ops, single, batches, kScale);

  // ZeRO-1's way: one bf16 buffer the micro-batches add into.
  LlamaModel buffered(config, HeadKind::language_model, ops);
  buffered.initialize(7);
  buffered.zero_gradients();
  for (const Batch& b : batches) l3::train::LanguageModelLoss(buffered).train(b, kScale);
  const std::vector<double> zero1 = to_host(ops, buffered.gradients());

  // ZeRO-2: the model writes into the window's slots, each micro-batch's groups go through the
  // (one-rank) reduction and into the optimizers' fp32 pieces.
  LlamaModel windowed(config, HeadKind::language_model, ops, {.own_gradients = false});
  windowed.initialize(7);
  l3::parallel::DataParallelConfig dp;
  dp.bucket_elements = 3000;
  dp.placement = {
      .stage = l3::model::ZeroStage::gradients, .ranks = world.size(), .fp32_gradients = true};
  dp.exchange = l3::parallel::ExchangeChoice::mpi_staged;
  l3::parallel::DataParallel parallel(
      world, ops, windowed.layout(), dp, {},
      {.master = windowed.master_weights(), .compute = windowed.weight_copy()});
  windowed.set_gradient_window(parallel.gradient_window());
  windowed.zero_gradients();
  parallel.begin_step(windowed.gradients());
  for (const Batch& b : batches) {
    parallel.begin_micro_batch();
    l3::train::LanguageModelLoss(windowed).train(b, kScale);
    parallel.end_micro_batch();
  }
  parallel.finish_reduction();
  std::vector<double> zero2(exact.size(), 0.0);
  for (std::size_t b = 0; b < parallel.buckets().size(); ++b) {
    const ConstTensorView piece = parallel.optimizer().of_bucket(b).own_gradients();
    REQUIRE(piece.dtype() == l3::kernels::DType::f32);
    const std::vector<double> values = to_host(ops, piece);
    std::copy(values.begin(), values.end(), zero2.begin() + parallel.piece(b, world.rank()).begin);
  }

  const double zero1_error = l3::test::relative_rms(exact, zero1);
  const double zero2_error = l3::test::relative_rms(exact, zero2);
  INFO("relative error against the exact sum of " << kMicro << " micro-batches: ZeRO-1 (bf16 "
                                                  << "buffer) " << zero1_error
                                                  << ", ZeRO-2 (fp32 shard) " << zero2_error);
  // fp32 sums of eight bf16 values: a few fp32 ulps at most. bf16 running sums: about 2^-9
  // per rounding.
  CHECK(zero2_error < 1e-6);
  CHECK(zero1_error > 1e-4);
  WARN("relative error of " << kMicro << " accumulated micro-batches: ZeRO-1 (bf16 buffer) "
                            << zero1_error << ", ZeRO-2 (fp32 shard) " << zero2_error);
}

TEST_CASE("an fp32 gradient buffer on the GPU adds micro-batches up without rounding",
          "[gpu][zero]") {
  // --grad-accum-dtype fp32 (the default with several micro-batches per step) for ZeRO-0/1: the
  // model's whole buffer is fp32 and every weight gradient (tied embedding and lm_head included)
  // adds into it unrounded. Exact reference: each micro-batch's gradient computed alone into a
  // zeroed fp32 buffer, summed in fp64.
  l3::cuda::CudaOps ops;
  l3::model::ModelConfig config = l3::model::preset("tiny");
  config.n_layers = 2;
  config.tie_word_embeddings = true;
  constexpr int kMicro = 8;
  constexpr float kScale = 1.0F / 256;
  std::vector<Batch> batches;
  for (int m = 0; m < kMicro; ++m) batches.push_back(micro_batch(m, config.vocab_size));
  const l3::model::ModelOptions fp32{.fp32_gradients = true};

  LlamaModel single(config, HeadKind::language_model, ops, fp32);
  single.initialize(7);
  REQUIRE(single.gradients().dtype() == l3::kernels::DType::f32);
  const std::vector<double> exact = exact_sum(ops, single, batches, kScale);
  LlamaModel accumulated(config, HeadKind::language_model, ops, fp32);
  accumulated.initialize(7);
  accumulated.zero_gradients();
  for (const Batch& b : batches) l3::train::LanguageModelLoss(accumulated).train(b, kScale);
  LlamaModel buffered(config, HeadKind::language_model, ops);  // bf16, as before
  buffered.initialize(7);
  buffered.zero_gradients();
  for (const Batch& b : batches) l3::train::LanguageModelLoss(buffered).train(b, kScale);

  const double fp32_error = l3::test::relative_rms(exact, to_host(ops, accumulated.gradients()));
  const double bf16_error = l3::test::relative_rms(exact, to_host(ops, buffered.gradients()));
  CHECK(fp32_error < 1e-6);
  CHECK(bf16_error > 1e-4);
  WARN("relative error of " << kMicro << " accumulated micro-batches (tied embeddings): fp32 "
                            << "buffer " << fp32_error << ", bf16 buffer " << bf16_error);
}
