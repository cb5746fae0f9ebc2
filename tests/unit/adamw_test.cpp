#include "kernels/cpu/adamw.hpp"

#include <cmath>

#include "catch.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "numeric_support.hpp"
#include "train/adamw_optimizer.hpp"
#include "train/lr_schedule.hpp"

TEST_CASE("AdamW step matches torch.optim.AdamW's formula in double", "[kernels][adamw]") {
  INFO("seed " << l3::test::test_seed());
  l3::test::Random rnd(15);
  const std::size_t n = 100;
  auto p = rnd.normal(n);
  auto m = std::vector<float>(n, 0.0F);
  auto v = std::vector<float>(n, 0.0F);
  std::vector<double> pd(p.begin(), p.end());
  std::vector<double> md(n, 0.0);
  std::vector<double> vd(n, 0.0);
  const double lr = 1e-2;
  const double b1 = 0.9;
  const double b2 = 0.95;
  const double eps = 1e-8;
  const double wd = 0.1;
  const double scale = 0.5;
  for (std::int64_t t = 1; t <= 5; ++t) {
    const auto g = rnd.normal(n);
    l3::kernels::cpu::adamw(
        p, g, m, v, {float(lr), float(b1), float(b2), float(eps), float(wd), float(scale), t});
    for (std::size_t i = 0; i < n; ++i) {
      const double gi = g[i] * scale;
      pd[i] *= 1 - lr * wd;
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      const double bc1 = 1 - std::pow(b1, double(t));
      const double bc2 = 1 - std::pow(b2, double(t));
      pd[i] -= lr / bc1 * md[i] / (std::sqrt(vd[i]) / std::sqrt(bc2) + eps);
    }
  }
  CHECK(l3::test::rel_error(p, pd) < 1e-5);
}

TEST_CASE("AdamW decays 2-D weights only and lr 0 changes nothing", "[adamw]") {
  l3::kernels::CpuOps ops;
  const l3::model::ParameterLayout layout(l3::model::preset("tiny"),
                                          l3::model::HeadKind::language_model);
  auto params = ops.allocate(l3::kernels::DType::f32, layout.total());
  auto grads = ops.allocate(l3::kernels::DType::f32, layout.total());
  for (float& x : params.as<float>()) x = 1.0F;  // padding too: it must stay untouched? it is 1
  l3::train::AdamW opt(ops, layout, {0.9F, 0.95F, 1e-8F, 0.5F});

  opt.step(params.view(), {}, grads.view(), 0.0F, 1.0F);  // lr 0: nothing moves
  for (const float x : params.as<float>()) REQUIRE(x == 1.0F);

  // Zero gradients and lr 0.1: only decay moves weights, norms stay at 1.
  opt.step(params.view(), {}, grads.view(), 0.1F, 1.0F);
  const auto& norm = layout.find("model.layers.0.input_layernorm.weight");
  const auto& q = layout.find("model.layers.0.self_attn.q_proj.weight");
  CHECK(params.as<float>()[static_cast<std::size_t>(norm.offset)] == 1.0F);
  CHECK(params.as<float>()[static_cast<std::size_t>(q.offset)] == Approx(1.0 - 0.1 * 0.5));
  CHECK(opt.steps_taken() == 2);
}

TEST_CASE("a ZeRO shard updates exactly its range, like the whole", "[adamw]") {
  INFO("seed " << l3::test::test_seed());
  l3::kernels::CpuOps ops;
  const l3::model::ParameterLayout layout(l3::model::preset("tiny"),
                                          l3::model::HeadKind::language_model);
  l3::test::Random rnd(16);
  const auto init = rnd.normal(static_cast<std::size_t>(layout.total()));
  const auto grad = rnd.normal(init.size());
  auto whole = ops.allocate(l3::kernels::DType::f32, layout.total());
  auto sharded = ops.allocate(l3::kernels::DType::f32, layout.total());
  auto grads = ops.allocate(l3::kernels::DType::f32, layout.total());
  std::copy(init.begin(), init.end(), whole.as<float>().begin());
  std::copy(init.begin(), init.end(), sharded.as<float>().begin());
  std::copy(grad.begin(), grad.end(), grads.as<float>().begin());
  l3::train::AdamW all(ops, layout, {});
  all.step(whole.view(), {}, grads.view(), 1e-3F, 0.7F);
  const std::int64_t cut = layout.total() / 3 + 17;  // through the middle of a tensor
  l3::train::AdamW first(ops, layout, {}, {.begin = 0, .end = cut});
  l3::train::AdamW second(ops, layout, {}, {.begin = cut, .end = layout.total()});
  first.step(sharded.view(), {}, grads.view(), 1e-3F, 0.7F);
  second.step(sharded.view(), {}, grads.view(), 1e-3F, 0.7F);
  CHECK(
      std::equal(whole.as<float>().begin(), whole.as<float>().end(), sharded.as<float>().begin()));
}

TEST_CASE("a shard that keeps its own gradients (ZeRO-2) updates like one reading the whole",
          "[adamw]") {
  INFO("seed " << l3::test::test_seed());
  l3::kernels::CpuOps ops;
  const l3::model::ParameterLayout layout(l3::model::preset("tiny"),
                                          l3::model::HeadKind::language_model);
  l3::test::Random rnd(17);
  const auto init = rnd.normal(static_cast<std::size_t>(layout.total()));
  const auto grad = rnd.normal(init.size());
  const std::int64_t begin = layout.total() / 4 + 5;
  const std::int64_t end = layout.total() / 2 + 3;
  auto reading = ops.allocate(l3::kernels::DType::f32, layout.total());
  auto owning = ops.allocate(l3::kernels::DType::f32, layout.total());
  auto grads = ops.allocate(l3::kernels::DType::f32, layout.total());
  std::copy(init.begin(), init.end(), reading.as<float>().begin());
  std::copy(init.begin(), init.end(), owning.as<float>().begin());
  std::copy(grad.begin(), grad.end(), grads.as<float>().begin());
  l3::train::AdamW plain(ops, layout, {}, {.begin = begin, .end = end});
  l3::train::AdamW own(ops, layout, {}, {.begin = begin, .end = end, .own_gradients = true});
  REQUIRE(own.own_gradients().numel() == end - begin);
  REQUIRE(own.own_gradients().dtype() == l3::kernels::DType::f32);  // whatever the compute dtype
  REQUIRE(plain.own_gradients().empty());
  // Two halves added in: the sum of the pieces, as a micro-batch each.
  const std::vector<float> half(grad.begin() + begin, grad.begin() + end);
  std::vector<float> halves(half.size());
  for (std::size_t i = 0; i < half.size(); ++i) halves[i] = half[i] * 0.5F;
  ops.add_into(own.own_gradients(), l3::kernels::ConstTensorView(std::span<const float>(halves)));
  ops.add_into(own.own_gradients(), l3::kernels::ConstTensorView(std::span<const float>(halves)));
  plain.step(reading.view(), {}, grads.view(), 1e-3F, 0.7F);
  own.step(owning.view(), {}, {}, 1e-3F, 0.7F);
  CHECK(std::equal(reading.as<float>().begin(), reading.as<float>().end(),
                   owning.as<float>().begin()));
}

TEST_CASE("add_into adds elementwise, each sum rounded once", "[kernels]") {
  INFO("seed " << l3::test::test_seed());
  l3::kernels::CpuOps ops;
  l3::test::Random rnd(18);
  const std::size_t n = 70001;  // the threaded path
  auto dst = rnd.normal(n, 3.0F);
  const auto src = rnd.normal(n);
  const auto before = dst;
  ops.add_into(l3::kernels::TensorView(std::span<float>(dst)),
               l3::kernels::ConstTensorView(std::span<const float>(src)));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i)
    wrong += dst[i] != static_cast<float>(double(before[i]) + double(src[i])) ? 1 : 0;
  CHECK(wrong == 0);
}

TEST_CASE("LR schedule: linear warmup, cosine to min_lr", "[train]") {
  const l3::train::LrSchedule s{1.0, 0.1, 10, 110};
  CHECK(s.at(0) == Approx(0.1));
  CHECK(s.at(4) == Approx(0.5));
  CHECK(s.at(9) == Approx(1.0));
  CHECK(s.at(10) == Approx(1.0));
  CHECK(s.at(109) == Approx(0.1));
  CHECK(s.at(59) == Approx(0.1 + 0.45 * (1 + std::cos(M_PI * 49.0 / 99.0))));
  for (std::int64_t t = 10; t < 109; ++t) CHECK(s.at(t + 1) <= s.at(t));
  const l3::train::LrSchedule zero{0.0, 0.0, 5, 50};
  for (std::int64_t t = 0; t < 50; ++t) CHECK(zero.at(t) == 0.0);
  CHECK(l3::train::clip_factor(2.0, 1.0) == Approx(0.5).epsilon(1e-5));
  CHECK(l3::train::clip_factor(0.5, 1.0) == 1.0);
  CHECK(l3::train::clip_factor(5.0, 0.0) == 1.0);
}
