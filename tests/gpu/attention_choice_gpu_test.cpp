// --attention on the CUDA backend: what cuDNN attention supports by GPU and cuDNN version (pure),
// what auto resolves to on this device, and which attention the backend then runs. On the CPU
// emulation (sm_90, cuDNN 9.19 headers, no engines) auto picks cuDNN, whose every call declines
// to the fallback: the run's report says so; on an H100/H200 the calls run on cuDNN.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "gpu_test_support.hpp"
#include "kernels/backend_options.hpp"
#include "kernels/backends.hpp"
#include "kernels/cuda/cudnn_attention.hpp"

using l3::kernels::Attention;
using l3::kernels::Backend;

TEST_CASE("cuDNN attention's support by GPU and cuDNN version", "[gpu]") {
  CHECK(l3::cuda::cudnn_attention_unavailable(91900, 9, 0).empty());
  CHECK(l3::cuda::cudnn_attention_unavailable(91002, 9, 0).empty());
  CHECK(l3::cuda::cudnn_attention_unavailable(91001, 9, 0) ==
        "cuDNN runtime 91001 is older than 91002");
  CHECK(l3::cuda::cudnn_attention_unavailable(91900, 8, 0) ==
        "GPU sm_80 (cuDNN attention here: sm_90 or sm_100)");
  CHECK(l3::cuda::cudnn_attention_unavailable(91900, 10, 0).empty());
  CHECK(l3::cuda::cudnn_deterministic_backward_unavailable(9, 0).empty());
  CHECK(l3::cuda::cudnn_deterministic_backward_unavailable(10, 0) ==
        "a deterministic backward on sm_100 (cuDNN attention here: sm_90)");
  // auto on those: cuDNN deterministic on sm_90, the fallback on sm_80 and sm_100.
  auto automatic_on = [](std::size_t version, int major) {
    return l3::kernels::choose_attention(
        Attention::automatic, false,
        {.unavailable = l3::cuda::cudnn_attention_unavailable(version, major, 0),
         .deterministic_unavailable =
             l3::cuda::cudnn_deterministic_backward_unavailable(major, 0)});
  };
  CHECK(automatic_on(91900, 9).cudnn);
  CHECK_FALSE(automatic_on(91900, 8).cudnn);
  CHECK_FALSE(automatic_on(91900, 10).cudnn);
  CHECK_FALSE(automatic_on(90100, 9).cudnn);
}

namespace {

// One attention forward and backward on `ops` (2 segments, GQA 4/2, head_dim 64).
void one_step(l3::cuda::CudaOps& ops) {
  const std::vector<std::int32_t> cu = {0, 40, 96};
  const std::int64_t n = cu.back();
  l3::test::Random rnd(7);
  const auto q = l3::test::upload(ops, l3::test::round_bf16(rnd.normal(n * 4 * 64)), {n, 4, 64});
  const auto k = l3::test::upload(ops, l3::test::round_bf16(rnd.normal(n * 2 * 64)), {n, 2, 64});
  const auto v = l3::test::upload(ops, l3::test::round_bf16(rnd.normal(n * 2 * 64)), {n, 2, 64});
  const auto dout = l3::test::upload(ops, l3::test::round_bf16(rnd.normal(n * 4 * 64)), {n, 4, 64});
  const auto gcu = l3::test::upload_raw(ops, cu);
  const l3::kernels::PackedSegments segments{.cu_seqlens = gcu.view(), .max_segment = 56};
  const auto out = l3::test::poisoned(ops, {n, 4, 64});
  const auto lse = l3::test::poisoned(ops, {4, n}, l3::kernels::DType::f32);
  const auto dq = l3::test::poisoned(ops, {n, 4, 64});
  const auto dk = l3::test::poisoned(ops, {n, 2, 64});
  const auto dv = l3::test::poisoned(ops, {n, 2, 64});
  ops.attention({.out = out.view(),
                 .lse = lse.view(),
                 .q = q.view(),
                 .k = k.view(),
                 .v = v.view(),
                 .segments = segments});
  ops.attention_backward({.dq = dq.view(),
                          .dk = dk.view(),
                          .dv = dv.view(),
                          .dout = dout.view(),
                          .out = out.view(),
                          .lse = lse.view(),
                          .q = q.view(),
                          .k = k.view(),
                          .v = v.view(),
                          .segments = segments});
  for (const float x : l3::test::download(ops, dq.view())) REQUIRE(std::isfinite(x));
}

}  // namespace

TEST_CASE("attention auto runs cuDNN's deterministic attention where the device has it", "[gpu]") {
  const l3::kernels::CudnnSupport support = l3::kernels::cudnn_support(0);
  const l3::kernels::AttentionChoice choice =
      l3::kernels::attention_choice(Attention::automatic, false, 0);
  CHECK(choice.cudnn == (support.unavailable.empty() && support.deterministic_unavailable.empty()));
  CHECK(choice.deterministic_backward);
  if (l3::test::kEmulatedDevice) CHECK(choice.cudnn);  // the emulation says sm_90, cuDNN 9.19

  for (const Attention attention : {Attention::automatic, Attention::cudnn,
                                    Attention::cudnn_nondeterministic, Attention::fallback}) {
    INFO("--attention " << l3::kernels::attention_name(attention));
    const std::unique_ptr<l3::kernels::Ops> ops =
        l3::kernels::make_ops(Backend::cuda, 0, {.attention = attention});
    auto& cuda = dynamic_cast<l3::cuda::CudaOps&>(*ops);
    one_step(cuda);
    const bool cudnn_asked =
        attention == Attention::automatic ? choice.cudnn : attention != Attention::fallback;
    // CudaOps reports its attention calls only when it has cuDNN to ask.
    CHECK(cuda.report().starts_with("attention: ") == cudnn_asked);
    if (cudnn_asked) {
      CHECK(cuda.attention_counts().cudnn + cuda.attention_counts().fallback == 2);
      if (l3::test::kEmulatedDevice) {
        CHECK(cuda.attention_counts().fallback == 2);
        CHECK(cuda.report().find("no cuDNN engines") != std::string::npos);
      }
    }
  }
  // cudnn-nondeterministic with --deterministic: a usage error, before any device work.
  try {
    (void)l3::kernels::make_ops(
        Backend::cuda, 0, {.attention = Attention::cudnn_nondeterministic, .deterministic = true});
    FAIL("made a non-deterministic attention for --deterministic");
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::usage);
  }
}

TEST_CASE("the CPU backend runs its own attention for auto and fallback, refuses cuDNN", "[gpu]") {
  for (const Attention attention : {Attention::automatic, Attention::fallback}) {
    CHECK(l3::kernels::make_ops(Backend::cpu, 0, {.attention = attention})->backend() ==
          Backend::cpu);
  }
  for (const Attention attention : {Attention::cudnn, Attention::cudnn_nondeterministic}) {
    try {
      (void)l3::kernels::make_ops(Backend::cpu, 0, {.attention = attention});
      FAIL("the CPU backend took cuDNN attention");
    } catch (const l3::core::Error& e) {
      CHECK(e.kind() == l3::core::ErrorKind::usage);
      CHECK(std::string(e.what()).find("needs the CUDA backend") != std::string::npos);
    }
  }
}
