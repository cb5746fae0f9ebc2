// The cuDNN fused attention (kernels/cuda/cudnn_attention.hpp) against the CUDA fallback
// (CudaOps::attention*) and the CPU reference, on fresh bf16-rounded random inputs: causal,
// GQA and MHA, head_dim 64 and 128, packed segments of different lengths (1 and 0 included).
// Tolerances are relative errors ||a - b|| / ||b||: 2e-2 for the forward output (one bf16
// rounding of P and of O), 1e-3 for the fp32 log-sum-exp, 3e-2 for dq, dk, dv (bf16 P and dS
// enter second GEMMs). Outputs are NaN-poisoned first, with a poisoned guard region after
// them that must stay untouched; NaN/Inf never pass.
#include "kernels/cuda/cudnn_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "catch.hpp"
#include "gpu_test_support.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/op_shapes.hpp"
#include "numeric_support.hpp"

using l3::kernels::AttentionArgs;
using l3::kernels::AttentionBackwardArgs;
using l3::kernels::AttentionShape;
using l3::kernels::Buffer;
using l3::kernels::DType;
using l3::kernels::PackedSegments;
using l3::kernels::Shape;
using l3::kernels::TensorView;
using l3::test::download;
using l3::test::expect_close;
using l3::test::poisoned;
using l3::test::rel_error;
using l3::test::round_bf16;
using l3::test::upload;
using l3::test::upload_raw;

namespace {

constexpr double kForwardTolerance = 2e-2;
constexpr double kLseTolerance = 1e-3;
constexpr double kBackwardTolerance = 3e-2;
constexpr std::int64_t kGuard = 64;  // poisoned elements after every output

// A NaN-filled device output of `shape` followed by kGuard NaN elements nobody may write.
struct Output {
  Output(l3::cuda::CudaOps& gpu, const Shape& output_shape, DType dtype = DType::bf16)
      : shape(output_shape),
        n(output_shape.numel()),
        buffer(poisoned(gpu, output_shape.numel() + kGuard, dtype)) {}
  [[nodiscard]] TensorView view() const { return buffer.first(shape); }
  [[nodiscard]] std::vector<float> values(l3::cuda::CudaOps& gpu) const {
    return download(gpu, view());
  }
  [[nodiscard]] bool guard_intact(l3::cuda::CudaOps& gpu) const {
    const std::vector<float> all = download(gpu, buffer.view());
    return std::all_of(all.begin() + n, all.end(), [](float x) { return std::isnan(x); });
  }
  [[nodiscard]] bool untouched(l3::cuda::CudaOps& gpu) const {
    const std::vector<float> all = download(gpu, buffer.view());
    return std::all_of(all.begin(), all.end(), [](float x) { return std::isnan(x); });
  }
  Shape shape;
  std::int64_t n;
  Buffer buffer;
};

// dq, dk, dv outputs of one backward.
struct Grads {
  Grads(l3::cuda::CudaOps& gpu, const Shape& q_shape, const Shape& kv_shape)
      : dq(gpu, q_shape), dk(gpu, kv_shape), dv(gpu, kv_shape) {}
  Output dq;
  Output dk;
  Output dv;
};

AttentionShape shape_of(const std::vector<std::int32_t>& cu, int heads, int kv_heads,
                        int head_dim) {
  int longest = 0;
  for (std::size_t i = 1; i < cu.size(); ++i) longest = std::max(longest, cu[i] - cu[i - 1]);
  return {cu.back(), heads, kv_heads, head_dim, static_cast<int>(cu.size()) - 1, longest};
}

// The views' shapes of an attention call of `s`: q, out (N, heads, head_dim), k, v (N, kv_heads,
// head_dim), lse (heads, N).
Shape q_shape(const AttentionShape& s) { return {s.tokens, s.n_heads, s.head_dim}; }
Shape kv_shape(const AttentionShape& s) { return {s.tokens, s.n_kv_heads, s.head_dim}; }
Shape lse_shape(const AttentionShape& s) { return {s.n_heads, s.tokens}; }

// Host inputs and the CPU reference results of one case.
struct Reference {
  std::vector<float> q, k, v, dout;
  std::vector<float> out, lse, dq, dk, dv;
};

Reference reference(const std::vector<std::int32_t>& cu, const AttentionShape& s,
                    std::uint32_t stream) {
  l3::test::Random rnd(stream);
  const std::int64_t n = s.tokens;
  const std::int64_t qs = static_cast<std::int64_t>(s.n_heads) * s.head_dim;
  const std::int64_t kvs = static_cast<std::int64_t>(s.n_kv_heads) * s.head_dim;
  Reference r;
  r.q = round_bf16(rnd.normal(n * qs));
  r.k = round_bf16(rnd.normal(n * kvs));
  r.v = round_bf16(rnd.normal(n * kvs));
  r.dout = round_bf16(rnd.normal(n * qs));
  r.out.resize(r.q.size());
  r.lse.resize(n * s.n_heads);
  r.dq.resize(r.q.size());
  r.dk.resize(r.k.size());
  r.dv.resize(r.v.size());
  const l3::kernels::cpu::AttentionHeads heads{s.n_heads, s.n_kv_heads, s.head_dim};
  l3::kernels::cpu::attention(r.out, r.lse, r.q, r.k, r.v, cu, heads);
  const auto out_b = round_bf16(r.out);  // the GPU backward reads a bf16 output
  l3::kernels::cpu::attention_backward(r.dq, r.dk, r.dv, r.dout, out_b, r.lse, r.q, r.k, r.v, cu,
                                       heads);
  return r;
}

// The reference inputs and the segment table on the device.
struct DeviceInputs {
  Buffer q, k, v, dout, cu;
};

DeviceInputs upload_inputs(l3::cuda::CudaOps& gpu, const Reference& ref,
                           const std::vector<std::int32_t>& cu, const AttentionShape& s) {
  return {upload(gpu, ref.q, q_shape(s)), upload(gpu, ref.k, kv_shape(s)),
          upload(gpu, ref.v, kv_shape(s)), upload(gpu, ref.dout, q_shape(s)), upload_raw(gpu, cu)};
}

// A forward's arguments: out and lse into `out`, `lse`, from `in`.
AttentionArgs forward_args(const Output& out, const Output& lse, const DeviceInputs& in,
                           const PackedSegments& segments) {
  return {.out = out.view(),
          .lse = lse.view(),
          .q = in.q.view(),
          .k = in.k.view(),
          .v = in.v.view(),
          .segments = segments};
}

// A backward's arguments: gradients into `g`, from `in` and the forward's `out` and `lse`.
AttentionBackwardArgs backward_args(const Grads& g, const Output& out, const Output& lse,
                                    const DeviceInputs& in, const PackedSegments& segments) {
  return {.dq = g.dq.view(),
          .dk = g.dk.view(),
          .dv = g.dv.view(),
          .dout = in.dout.view(),
          .out = out.view(),
          .lse = lse.view(),
          .q = in.q.view(),
          .k = in.k.view(),
          .v = in.v.view(),
          .segments = segments};
}

// Runs one case through the fallback and cuDNN and compares everything.
void check_case(const std::vector<std::int32_t>& cu, int heads, int kv_heads, int head_dim,
                std::uint32_t stream, bool pass_host_cu) {
  INFO("seed " << l3::test::test_seed() << ", " << cu.size() - 1 << " segments, " << cu.back()
               << " tokens, heads " << heads << "/" << kv_heads << ", head_dim " << head_dim);
  const AttentionShape shape = shape_of(cu, heads, kv_heads, head_dim);
  const Reference ref = reference(cu, shape, stream);
  const std::span<const std::int32_t> host_cu =
      pass_host_cu ? std::span<const std::int32_t>(cu) : std::span<const std::int32_t>();

  l3::cuda::CudaOps gpu;
  l3::cuda::CudnnAttention cudnn;
  const DeviceInputs in = upload_inputs(gpu, ref, cu, shape);
  const PackedSegments segments{
      .cu_seqlens = in.cu.view(), .max_segment = shape.max_segment, .host = host_cu};

  // the fallback, the CUDA backend's reference path
  const Output f_out(gpu, q_shape(shape));
  const Output f_lse(gpu, lse_shape(shape), DType::f32);
  gpu.attention(forward_args(f_out, f_lse, in, segments));
  const Grads f(gpu, q_shape(shape), kv_shape(shape));
  gpu.attention_backward(backward_args(f, f_out, f_lse, in, segments));
  const auto f_dq = f.dq.values(gpu);
  const auto f_dk = f.dk.values(gpu);
  const auto f_dv = f.dv.values(gpu);

  // cuDNN forward, with the shape the backend derives from the views
  const Output c_out(gpu, q_shape(shape));
  const Output c_lse(gpu, lse_shape(shape), DType::f32);
  const AttentionArgs c_args = forward_args(c_out, c_lse, in, segments);
  const bool ran = cudnn.forward(c_args, l3::kernels::attention_shape(c_args), gpu.stream());
  INFO("cuDNN: " << cudnn.last_unsupported_reason());
  REQUIRE(ran);
  INFO(cudnn.describe_plans());
  const auto out = c_out.values(gpu);
  const auto lse = c_lse.values(gpu);
  expect_close("out vs cpu", out, ref.out, kForwardTolerance);
  expect_close("out vs fallback", out, f_out.values(gpu), kForwardTolerance);
  expect_close("lse vs cpu", lse, ref.lse, kLseTolerance);
  expect_close("lse vs fallback", lse, f_lse.values(gpu), kLseTolerance);
  CHECK(c_out.guard_intact(gpu));
  CHECK(c_lse.guard_intact(gpu));

  // cuDNN backward on cuDNN's own forward results
  const Grads c(gpu, q_shape(shape), kv_shape(shape));
  const AttentionBackwardArgs c_back = backward_args(c, c_out, c_lse, in, segments);
  const bool ran_back = cudnn.backward(c_back, l3::kernels::attention_shape(c_back), gpu.stream());
  INFO("cuDNN backward: " << cudnn.last_unsupported_reason());
  REQUIRE(ran_back);
  const auto dq = c.dq.values(gpu);
  const auto dk = c.dk.values(gpu);
  const auto dv = c.dv.values(gpu);
  expect_close("dq vs cpu", dq, ref.dq, kBackwardTolerance);
  expect_close("dk vs cpu", dk, ref.dk, kBackwardTolerance);
  expect_close("dv vs cpu", dv, ref.dv, kBackwardTolerance);
  expect_close("dq vs fallback", dq, f_dq, kBackwardTolerance);
  expect_close("dk vs fallback", dk, f_dk, kBackwardTolerance);
  expect_close("dv vs fallback", dv, f_dv, kBackwardTolerance);
  CHECK(c.dq.guard_intact(gpu));
  CHECK(c.dk.guard_intact(gpu));
  CHECK(c.dv.guard_intact(gpu));

  // the lse contract: cuDNN's backward on the fallback's forward (out, lse) gives the
  // fallback's gradients
  const Grads x(gpu, q_shape(shape), kv_shape(shape));
  const AttentionBackwardArgs x_back = backward_args(x, f_out, f_lse, in, segments);
  REQUIRE(cudnn.backward(x_back, l3::kernels::attention_shape(x_back), gpu.stream()));
  expect_close("dq from the fallback's lse", x.dq.values(gpu), f_dq, kBackwardTolerance);
  expect_close("dk from the fallback's lse", x.dk.values(gpu), f_dk, kBackwardTolerance);
  expect_close("dv from the fallback's lse", x.dv.values(gpu), f_dv, kBackwardTolerance);
}

}  // namespace

TEST_CASE("cuDNN attention, GQA 8/2 heads, head_dim 64, segments of 37 3 260 1 119", "[gpu]") {
  check_case({0, 37, 40, 300, 301, 420}, 8, 2, 64, 201, true);
}

TEST_CASE("cuDNN attention, GQA 8/2 heads, head_dim 128, an empty and a 1-token segment", "[gpu]") {
  check_case({0, 1, 130, 130, 257, 300}, 8, 2, 128, 202, true);
}

TEST_CASE("cuDNN attention, MHA 4/4 heads, head_dim 64, one segment, no host cu_seqlens", "[gpu]") {
  check_case({0, 200}, 4, 4, 64, 203, false);
}

TEST_CASE("cuDNN attention, MQA 8/1 heads, head_dim 128, many short segments", "[gpu]") {
  std::vector<std::int32_t> cu = {0};
  for (const int length : {5, 1, 17, 64, 2, 33, 1, 90, 8, 129}) cu.push_back(cu.back() + length);
  check_case(cu, 8, 1, 128, 204, true);
}

TEST_CASE("cuDNN attention, large: 4 segments, 2048 tokens, 32/8 heads, head_dim 128", "[gpu]") {
  check_case({0, 1000, 1017, 1529, 2048}, 32, 8, 128, 205, true);
}

TEST_CASE("cuDNN attention refuses what it cannot run, without throwing or writing", "[gpu]") {
  l3::cuda::CudaOps gpu;
  l3::cuda::CudnnAttention cudnn;
  const std::vector<std::int32_t> cu = {0, 5, 12};
  const auto gcu = upload_raw(gpu, cu);
  l3::test::Random rnd(206);

  // `s` is passed as given rather than derived from the views (kernels::attention_shape): that
  // derivation already rejects heads that are not a multiple of the kv heads.
  const auto refuses = [&](const AttentionShape& s, DType input_type, std::int64_t misalign) {
    const std::int64_t qn = q_shape(s).numel();
    const std::int64_t kvn = kv_shape(s).numel();
    const auto q = upload(gpu, rnd.normal(qn + 8), input_type);
    const auto k = upload(gpu, rnd.normal(kvn), kv_shape(s), input_type);
    const auto v = upload(gpu, rnd.normal(kvn), kv_shape(s), input_type);
    const auto q_view = q.slice(misalign, qn).reshape(q_shape(s));
    const PackedSegments segments{
        .cu_seqlens = gcu.view(), .max_segment = s.max_segment, .host = cu};
    const Output out(gpu, q_shape(s));
    const Output lse(gpu, lse_shape(s), DType::f32);
    bool ran = true;
    REQUIRE_NOTHROW(ran = cudnn.forward({.out = out.view(),
                                         .lse = lse.view(),
                                         .q = q_view,
                                         .k = k.view(),
                                         .v = v.view(),
                                         .segments = segments},
                                        s, gpu.stream()));
    INFO("reason: " << cudnn.last_unsupported_reason());
    CHECK_FALSE(ran);
    CHECK_FALSE(cudnn.last_unsupported_reason().empty());
    CHECK(out.untouched(gpu));
    CHECK(lse.untouched(gpu));

    const auto dout = upload(gpu, rnd.normal(qn), q_shape(s), input_type);
    const Grads g(gpu, q_shape(s), kv_shape(s));
    bool ran_back = true;
    REQUIRE_NOTHROW(ran_back = cudnn.backward({.dq = g.dq.view(),
                                               .dk = g.dk.view(),
                                               .dv = g.dv.view(),
                                               .dout = dout.view(),
                                               .out = out.view(),
                                               .lse = lse.view(),
                                               .q = q_view,
                                               .k = k.view(),
                                               .v = v.view(),
                                               .segments = segments},
                                              s, gpu.stream()));
    CHECK_FALSE(ran_back);
    CHECK(g.dq.untouched(gpu));
    CHECK(g.dk.untouched(gpu));
    CHECK(g.dv.untouched(gpu));
  };

  SECTION("head_dim not a multiple of 8") { refuses({12, 4, 2, 20, 2, 7}, DType::bf16, 0); }
  SECTION("head_dim a multiple of 8, not of 16") { refuses({12, 4, 2, 24, 2, 7}, DType::bf16, 0); }
  SECTION("head_dim above 128") { refuses({12, 4, 2, 256, 2, 7}, DType::bf16, 0); }
  SECTION("heads not a multiple of kv heads") { refuses({12, 6, 4, 64, 2, 7}, DType::bf16, 0); }
  SECTION("f32 inputs") { refuses({12, 4, 2, 64, 2, 7}, DType::f32, 0); }
  SECTION("q not 16-byte aligned") { refuses({12, 4, 2, 64, 2, 7}, DType::bf16, 1); }
  CHECK(cudnn.plan_count() == 0);
}

TEST_CASE("cuDNN attention with no tokens does nothing and succeeds", "[gpu]") {
  l3::cuda::CudaOps gpu;
  l3::cuda::CudnnAttention cudnn;
  const std::vector<std::int32_t> cu = {0};
  const auto gcu = upload_raw(gpu, cu);
  const auto empty = gpu.allocate(DType::bf16, 0);
  const auto empty_f = gpu.allocate(DType::f32, 0);
  const AttentionShape s{0, 8, 2, 64, 0, 0};
  const TensorView q = empty.view().reshape(q_shape(s));
  const TensorView kv = empty.view().reshape(kv_shape(s));
  const TensorView lse = empty_f.view().reshape(lse_shape(s));
  const PackedSegments segments{.cu_seqlens = gcu.view(), .host = cu};
  const AttentionArgs forward{.out = q, .lse = lse, .q = q, .k = kv, .v = kv, .segments = segments};
  CHECK(cudnn.forward(forward, l3::kernels::attention_shape(forward), gpu.stream()));
  const AttentionBackwardArgs backward{.dq = q,
                                       .dk = kv,
                                       .dv = kv,
                                       .dout = q,
                                       .out = q,
                                       .lse = lse,
                                       .q = q,
                                       .k = kv,
                                       .v = kv,
                                       .segments = segments};
  CHECK(cudnn.backward(backward, l3::kernels::attention_shape(backward), gpu.stream()));
  CHECK(cudnn.plan_count() == 0);
}

TEST_CASE("cuDNN attention reuses one plan for every packing of a bucket", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  l3::cuda::CudnnAttention cudnn;
  l3::test::Random rnd(207);
  const auto forward_matches_fallback = [&](const std::vector<std::int32_t>& cu) {
    const AttentionShape s = shape_of(cu, 8, 2, 64);
    const DeviceInputs in{upload(gpu, round_bf16(rnd.normal(q_shape(s).numel())), q_shape(s)),
                          upload(gpu, round_bf16(rnd.normal(kv_shape(s).numel())), kv_shape(s)),
                          upload(gpu, round_bf16(rnd.normal(kv_shape(s).numel())), kv_shape(s)),
                          {},
                          upload_raw(gpu, cu)};
    const PackedSegments segments{
        .cu_seqlens = in.cu.view(), .max_segment = s.max_segment, .host = cu};
    const Output f_out(gpu, q_shape(s));
    const Output f_lse(gpu, lse_shape(s), DType::f32);
    gpu.attention(forward_args(f_out, f_lse, in, segments));
    const Output c_out(gpu, q_shape(s));
    const Output c_lse(gpu, lse_shape(s), DType::f32);
    const AttentionArgs c_args = forward_args(c_out, c_lse, in, segments);
    const bool ran = cudnn.forward(c_args, l3::kernels::attention_shape(c_args), gpu.stream());
    INFO("cuDNN: " << cudnn.last_unsupported_reason());
    REQUIRE(ran);
    expect_close("out vs fallback", c_out.values(gpu), f_out.values(gpu), kForwardTolerance);
    expect_close("lse vs fallback", c_lse.values(gpu), f_lse.values(gpu), kLseTolerance);
  };
  forward_matches_fallback({0, 100, 150, 160});  // 3 segments, longest 100: bucket 4 x 128
  CHECK(cudnn.plan_count() == 1);
  forward_matches_fallback({0, 128, 129, 200, 300});  // 4 segments, longest 128: same bucket
  CHECK(cudnn.plan_count() == 1);
  forward_matches_fallback({0, 129, 140});  // 2 segments, longest 129: bucket 2 x 256
  CHECK(cudnn.plan_count() == 2);
  forward_matches_fallback({0, 10, 20, 30, 40, 50});  // 5 segments: batch bucket 8
  CHECK(cudnn.plan_count() == 3);
}

TEST_CASE("cuDNN attention deterministic backward is bitwise reproducible", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  const std::vector<std::int32_t> cu = {0, 300, 301, 555};
  const AttentionShape shape = shape_of(cu, 8, 2, 128);
  const Reference ref = reference(cu, shape, 208);
  l3::cuda::CudaOps gpu;
  l3::cuda::CudnnAttentionOptions options;
  options.deterministic = true;
  l3::cuda::CudnnAttention cudnn(options);
  const DeviceInputs in = upload_inputs(gpu, ref, cu, shape);
  const PackedSegments segments{
      .cu_seqlens = in.cu.view(), .max_segment = shape.max_segment, .host = cu};
  const Output out(gpu, q_shape(shape));
  const Output lse(gpu, lse_shape(shape), DType::f32);
  const AttentionArgs args = forward_args(out, lse, in, segments);
  const bool ran = cudnn.forward(args, l3::kernels::attention_shape(args), gpu.stream());
  INFO("cuDNN: " << cudnn.last_unsupported_reason());
  REQUIRE(ran);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    const Grads g(gpu, q_shape(shape), kv_shape(shape));
    const AttentionBackwardArgs back = backward_args(g, out, lse, in, segments);
    const bool ran_back = cudnn.backward(back, l3::kernels::attention_shape(back), gpu.stream());
    INFO("cuDNN deterministic backward: " << cudnn.last_unsupported_reason());
    REQUIRE(ran_back);
    runs.push_back(g.dq.values(gpu));
    runs.push_back(g.dk.values(gpu));
    runs.push_back(g.dv.values(gpu));
    expect_close("dq vs cpu", runs[runs.size() - 3], ref.dq, kBackwardTolerance);
    expect_close("dk vs cpu", runs[runs.size() - 2], ref.dk, kBackwardTolerance);
    expect_close("dv vs cpu", runs[runs.size() - 1], ref.dv, kBackwardTolerance);
  }
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("gradient " << i << " of dq, dk, dv");
    REQUIRE(runs[i].size() == runs[i + 3].size());
    CHECK(std::memcmp(runs[i].data(), runs[i + 3].data(), runs[i].size() * sizeof(float)) == 0);
  }
}
