// Every op of the CUDA backend against the CPU reference on the same (bf16-rounded) random
// inputs. Tolerances are relative errors ||gpu - cpu|| / ||cpu|| for bf16 storage with fp32
// accumulation: 1e-2 where one bf16 rounding of the output dominates, 2e-2 to 3e-2 where
// bf16 intermediates (probabilities, dlogits) enter a second GEMM. NaN/Inf never pass.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>
#include <utility>

#include "catch.hpp"
#include "gpu_test_support.hpp"
#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/bradley_terry.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/dpo_loss.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gather_dot.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/policy_loss.hpp"
#include "kernels/cpu/reductions.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/swiglu.hpp"
#include "model/rope_table.hpp"
#include "numeric_support.hpp"

using l3::kernels::DType;
using l3::test::download;
using l3::test::download_raw;
using l3::test::expect_close;
using l3::test::poisoned;
using l3::test::rel_error;
using l3::test::round_bf16;
using l3::test::upload;
using l3::test::upload_raw;

TEST_CASE("f32 <-> bf16 copies round to nearest even", "[gpu]") {
  l3::cuda::CudaOps gpu;
  l3::test::Random rnd(100);
  const auto x = rnd.normal(1000, 10.0F);
  const auto b = upload(gpu, x);
  const auto back = download(gpu, b.view());
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(back[i] == round_bf16(x[i]));
  const auto f = upload(gpu, x, DType::f32);
  CHECK(download(gpu, f.view()) == x);
  // Device to device, both ways, without staging.
  const auto widened = gpu.allocate(DType::f32, 1000);
  gpu.copy(widened.view(), b.view());
  CHECK(download(gpu, widened.view()) == back);
  // The eight-wide kernels with a tail (offsets 0 and 8: 16-byte aligned on both sides; counts
  // not multiples of 8) and unaligned views (offset 1: the one-wide kernels): the same values.
  const std::array<std::array<std::int64_t, 2>, 3> cases{{{0, 997}, {1, 999}, {8, 989}}};
  for (const auto& [skew, count] : cases) {
    INFO("offset " << skew << ", count " << count);
    const auto narrowed = poisoned(gpu, 1000);
    gpu.copy(narrowed.slice(skew, count), f.slice(skew, count));
    const auto got = download(gpu, narrowed.slice(skew, count));
    const std::vector<float> want(back.begin() + skew, back.begin() + skew + count);
    CHECK((got == want));
    const auto wide = poisoned(gpu, 1000, DType::f32);
    gpu.copy(wide.slice(skew, count), b.slice(skew, count));
    CHECK((download(gpu, wide.slice(skew, count)) == want));
  }
}

TEST_CASE("synchronize polls its wait checks while work is queued and passes on what they throw",
          "[gpu]") {
  // The NCCL exchange's check of asynchronous errors rides on this: a wait for the compute stream
  // must not block where a failed collective would hold it forever.
  l3::cuda::CudaOps gpu;
  const std::int64_t n = std::int64_t{16}
                         << 20;  // 32 MiB per copy: queued well past the first poll
  const auto a = gpu.allocate(DType::bf16, n);
  const auto b = gpu.allocate(DType::bf16, n);
  const auto queue_copies = [&] {
    for (int i = 0; i < 16; ++i)
      gpu.copy(i % 2 == 0 ? b.view() : a.view(), i % 2 == 0 ? a.view() : b.view());
  };
  // Two checks (two exchanges): both polled; one that throws stops the wait; removed, the others
  // stay.
  int polls = 0;
  int other_polls = 0;
  const int counting = gpu.add_wait_check([&polls] { ++polls; });
  const int other = gpu.add_wait_check([&other_polls] { ++other_polls; });
  queue_copies();
  gpu.synchronize();
  CHECK(polls > 0);
  CHECK(other_polls > 0);
  gpu.remove_wait_check(counting);
  const int failing = gpu.add_wait_check(
      [] { throw std::runtime_error("NCCL asynchronous error: remote peer lost"); });
  queue_copies();
  CHECK_THROWS_WITH(gpu.synchronize(), Catch::Contains("remote peer lost"));
  gpu.remove_wait_check(failing);
  polls = 0;
  other_polls = 0;
  queue_copies();
  gpu.synchronize();  // the queued work itself still completes
  CHECK(polls == 0);
  CHECK(other_polls > 0);
  gpu.remove_wait_check(other);
}

TEST_CASE("a thread bound to the backend works on its device", "[gpu]") {
  // CUDA's current device is per host thread: a host driving a session from a thread of its own
  // would otherwise allocate and launch on device 0. The trainer binds at every public call.
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices < 2) {
    WARN("one device: no other device to tell apart (the emulated build's test runs with two)");
    return;
  }
  l3::cuda::CudaOps gpu(1);
  int before = -1;
  int after = -1;
  cudaPointerAttributes attributes{};
  std::thread([&] {
    cudaGetDevice(&before);
    gpu.bind_thread();
    cudaGetDevice(&after);
    const auto buffer = gpu.allocate(DType::f32, 16);
    cudaPointerGetAttributes(&attributes, buffer.view().data());
  }).join();
  CHECK(before == 0);
  CHECK(after == 1);
  CHECK(attributes.device == 1);
}

TEST_CASE("converting copies of more than one staging chunk", "[gpu]") {
  // 16M elements per chunk: 2 chunks and a tail, each way.
  l3::cuda::CudaOps gpu;
  const std::int64_t n = (std::int64_t{16} << 20) * 2 + 1234;
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 65521) * 0.37F - 9.5F;
  const auto b = upload(gpu, x);
  const auto back = download(gpu, b.view());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < x.size(); ++i) wrong += back[i] != round_bf16(x[i]) ? 1 : 0;
  CHECK(wrong == 0);
}

TEST_CASE("matmul forward and backward", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  const std::int64_t m = 77, n = 96, k = 136;
  l3::test::Random rnd(101);
  const auto x = round_bf16(rnd.normal(m * k));
  const auto w = round_bf16(rnd.normal(n * k, 0.1F));
  const auto dy = round_bf16(rnd.normal(m * n));
  std::vector<float> y(m * n), dx(m * k), dw(n * k, 0.0F);
  l3::kernels::cpu::matmul(y, x, w, m, n, k, false);
  l3::kernels::cpu::matmul_backward(dx, dw, dy, x, w, m, n, k, false);

  const auto gx = upload(gpu, x, {m, k}), gw = upload(gpu, w, {n, k}),
             gdy = upload(gpu, dy, {m, n});
  const auto gy = poisoned(gpu, {m, n}), gdx = poisoned(gpu, {m, k});
  const auto gdw = upload(gpu, std::vector<float>(n * k, 0.0F), {n, k});
  gpu.matmul({.y = gy.view(), .x = gx.view(), .w = gw.view()});
  gpu.matmul_backward(
      {.dx = gdx.view(), .dw = gdw.view(), .dy = gdy.view(), .x = gx.view(), .w = gw.view()});
  expect_close("y", download(gpu, gy.view()), y, 1e-2);
  expect_close("dx", download(gpu, gdx.view()), dx, 1e-2);
  expect_close("dw", download(gpu, gdw.view()), dw, 1e-2);

  // fp32 output (the logits path) and accumulation
  const auto gy32 = poisoned(gpu, {m, n}, DType::f32);
  gpu.matmul({.y = gy32.view(), .x = gx.view(), .w = gw.view()});
  expect_close("y (f32 out)", download(gpu, gy32.view()), y, 1e-4);
  gpu.matmul({.y = gy32.view(), .x = gx.view(), .w = gw.view(), .accumulate = true});
  auto twice = y;
  for (float& v : twice) v *= 2;
  expect_close("y accumulated", download(gpu, gy32.view()), twice, 1e-4);

  // Views 16 bytes into their buffers (a slice of the flat weights, a chunk of rows): cuBLASLt
  // must be told, or its heuristic may pick an algorithm that needs 256-byte alignment.
  const std::int64_t skew = 8;
  const auto sx = upload(gpu, std::vector<float>(m * k + skew, 0.0F));
  const auto sw = upload(gpu, std::vector<float>(n * k + skew, 0.0F));
  gpu.copy(sx.slice(skew, m * k), gx.view());
  gpu.copy(sw.slice(skew, n * k), gw.view());
  const auto sy = poisoned(gpu, m * n + skew);
  const auto sx_at = sx.slice(skew, m * k).reshape({m, k});
  const auto sw_at = sw.slice(skew, n * k).reshape({n, k});
  gpu.matmul({.y = sy.slice(skew, m * n).reshape({m, n}), .x = sx_at, .w = sw_at});
  expect_close("y (skewed views)", download(gpu, sy.slice(skew, m * n)), y, 1e-2);
  const auto sdw = upload(gpu, std::vector<float>(n * k + skew, 0.0F));
  const auto sdx = poisoned(gpu, m * k + skew);
  gpu.matmul_backward({.dx = sdx.slice(skew, m * k).reshape({m, k}),
                       .dw = sdw.slice(skew, n * k).reshape({n, k}),
                       .dy = gdy.view(),
                       .x = sx_at,
                       .w = sw_at});
  expect_close("dx (skewed views)", download(gpu, sdx.slice(skew, m * k)), dx, 1e-2);
  expect_close("dw (skewed views)", download(gpu, sdw.slice(skew, n * k)), dw, 1e-2);
}

TEST_CASE("embedding forward and deterministic backward", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  const std::int64_t vocab = 300, hidden = 64, n = 1000;  // many repeated tokens
  l3::test::Random rnd(102);
  const auto table = round_bf16(rnd.normal(vocab * hidden));
  const auto tokens = rnd.integers(n, 50);
  const auto dout = round_bf16(rnd.normal(n * hidden));
  std::vector<float> out(n * hidden), dtable(vocab * hidden, 0.0F);
  l3::kernels::cpu::embedding(out, tokens, table, hidden);
  l3::kernels::cpu::embedding_backward(dtable, tokens, dout, hidden);

  const auto gtable = upload(gpu, table, {vocab, hidden}), gdout = upload(gpu, dout, {n, hidden});
  const auto gtokens = upload_raw(gpu, tokens);
  const auto gout = poisoned(gpu, {n, hidden});
  gpu.embedding({.out = gout.view(), .tokens = gtokens.view(), .table = gtable.view()});
  CHECK(download(gpu, gout.view()) == out);
  // An output view 2 bytes into its buffer: the one-wide path (the eight-wide one would load
  // misaligned, a fault on a GPU and a finding for UBSan here).
  const auto skewed = poisoned(gpu, n * hidden + 1);
  gpu.embedding({.out = skewed.slice(1, n * hidden).reshape({n, hidden}),
                 .tokens = gtokens.view(),
                 .table = gtable.view()});
  CHECK(download(gpu, skewed.slice(1, n * hidden)) == out);
  const auto gd1 = upload(gpu, std::vector<float>(vocab * hidden, 0.0F), {vocab, hidden});
  const auto gd2 = upload(gpu, std::vector<float>(vocab * hidden, 0.0F), {vocab, hidden});
  gpu.embedding_backward({.dtable = gd1.view(), .tokens = gtokens.view(), .dout = gdout.view()});
  gpu.embedding_backward({.dtable = gd2.view(), .tokens = gtokens.view(), .dout = gdout.view()});
  const auto d1 = download(gpu, gd1.view());
  expect_close("dtable", d1, dtable, 1e-2);
  CHECK(d1 == download(gpu, gd2.view()));  // bitwise repeatable
}

// The gradient's segments of 64 sorted positions: runs of one token inside a segment, across a
// boundary, over many segments (the sums that cross segments), at the ends, shorter than a
// segment, in both column paths, into bf16 and fp32 gradients. The fp32 gradient is held to
// 1e-5 of an fp64 sum: a piece of a run lost or counted twice is far outside that.
TEST_CASE("embedding backward sums runs of repeated tokens across segments", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  struct Case {
    const char* what;
    std::int64_t n, hidden;
    std::int32_t distinct;  // tokens drawn from [0, distinct)
    std::int32_t repeated;  // this token at `share` of the positions (-1: none)
    double share;
    std::int64_t dout_skew;  // dout 2 bytes into its buffer: the one-wide column path
  };
  const Case c =
      GENERATE(Case{"runs of about 20", 1000, 64, 50, -1, 0.0, 0},
               Case{"one token at 90% of the positions", 1000, 64, 40, 7, 0.9, 0},
               Case{"a few long runs, width not a multiple of 8", 1000, 100, 5, -1, 0.0, 0},
               Case{"one token everywhere, whole segments", 192, 72, 1, 0, 1.0, 0},
               Case{"fewer positions than a segment", 37, 72, 6, -1, 0.0, 0},
               Case{"long runs, dout unaligned", 700, 64, 3, 2, 0.5, 1});
  INFO(c.what);
  const std::int64_t vocab = 64;
  l3::test::Random rnd(103);
  auto tokens = rnd.integers(static_cast<std::size_t>(c.n), c.distinct);
  const auto coin = rnd.uniform(static_cast<std::size_t>(c.n), 0.0F, 1.0F);
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    if (c.repeated >= 0 && coin[t] < c.share) tokens[t] = c.repeated;
  }
  const auto dout = round_bf16(rnd.normal(c.n * c.hidden));
  std::vector<double> exact(static_cast<std::size_t>(vocab * c.hidden), 0.0);
  for (std::int64_t t = 0; t < c.n; ++t) {
    for (std::int64_t j = 0; j < c.hidden; ++j) {
      exact[static_cast<std::size_t>(tokens[static_cast<std::size_t>(t)] * c.hidden + j)] +=
          dout[static_cast<std::size_t>(t * c.hidden + j)];
    }
  }
  const std::vector<float> want(exact.begin(), exact.end());
  std::vector<float> padded(static_cast<std::size_t>(c.dout_skew), 0.0F);
  padded.insert(padded.end(), dout.begin(), dout.end());
  const auto gdout = upload(gpu, padded);
  const auto gtokens = upload_raw(gpu, tokens);
  const auto dout_view = gdout.slice(c.dout_skew, c.n * c.hidden).reshape({c.n, c.hidden});
  for (const DType dtype : {DType::f32, DType::bf16}) {
    INFO((dtype == DType::f32 ? "fp32 gradient" : "bf16 gradient"));
    const auto g1 =
        upload(gpu, std::vector<float>(vocab * c.hidden, 0.0F), {vocab, c.hidden}, dtype);
    const auto g2 =
        upload(gpu, std::vector<float>(vocab * c.hidden, 0.0F), {vocab, c.hidden}, dtype);
    gpu.embedding_backward({.dtable = g1.view(), .tokens = gtokens.view(), .dout = dout_view});
    gpu.embedding_backward({.dtable = g2.view(), .tokens = gtokens.view(), .dout = dout_view});
    const auto got = download(gpu, g1.view());
    expect_close("dtable", got, want, dtype == DType::f32 ? 1e-5 : 1e-2);
    CHECK((got == download(gpu, g2.view())));  // bitwise repeatable
  }
}

TEST_CASE("micro-batch inputs on the copy stream reach each micro-batch intact", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // Eight micro-batches through two alternating input sets, each behind a long matmul on the
  // compute stream, so that the copy stream runs ahead: a copy that did not wait for the
  // micro-batch two back to finish reading its set, or a kernel that did not wait for its
  // copies, would embed the wrong tokens.
  const std::int64_t vocab = 512, hidden = 128, n = 4096;
  const std::int64_t big = l3::test::kEmulatedDevice ? 256 : 4096;
  l3::test::Random rnd(110);
  const auto table = round_bf16(rnd.normal(vocab * hidden));
  const auto gtable = upload(gpu, table, {vocab, hidden});
  const auto ga = upload(gpu, round_bf16(rnd.normal(big * big, 0.01F)), {big, big});
  const auto gc = poisoned(gpu, {big, big});
  std::array<l3::kernels::Buffer, 2> sets{gpu.allocate(DType::i32, n), gpu.allocate(DType::i32, n)};
  // Outputs first: poisoning them copies from pageable memory, which waits for the stream.
  std::vector<l3::kernels::Buffer> outs;
  for (int k = 0; k < 8; ++k) outs.push_back(poisoned(gpu, {n, hidden}));
  std::vector<std::vector<std::int32_t>> batches;
  for (int k = 0; k < 8; ++k) {
    for (int r = 0; r < 10; ++r) {  // a few milliseconds of work ahead of the copies
      gpu.matmul({.y = gc.view(), .x = ga.view(), .w = ga.view()});
    }
    batches.push_back(rnd.integers(n, static_cast<std::int32_t>(vocab)));
    std::vector<std::int32_t> source = batches.back();
    const std::array<l3::kernels::HostUpload, 1> uploads{l3::kernels::HostUpload{
        sets[k % 2].view(), l3::kernels::ConstTensorView(std::span<const std::int32_t>(source))}};
    gpu.upload_inputs(k % 2, uploads);
    std::fill(source.begin(), source.end(), -1);  // the source is the caller's again on return
    gpu.embedding({.out = outs[static_cast<std::size_t>(k)].view(),
                   .tokens = sets[k % 2].view(),
                   .table = gtable.view()});
  }
  gpu.synchronize();
  // How long the compute stream stood waiting for the copies: a time, then reset.
  const double waited = gpu.take_input_wait_ms();
  CHECK(std::isfinite(waited));
  CHECK(waited >= 0.0);
  CHECK(gpu.take_input_wait_ms() == 0.0);
  for (std::size_t k = 0; k < outs.size(); ++k) {
    INFO("micro-batch " << k);
    std::vector<float> expected(n * hidden);
    l3::kernels::cpu::embedding(expected, batches[k], table, hidden);
    CHECK((download(gpu, outs[k].view()) == expected));
  }
}

TEST_CASE("rmsnorm forward and backward", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // 320: the 16-byte vectorised kernels; 100: not a multiple of 8, the scalar ones. 16384 (a
  // 405B-sized row, vectorised) and 12100 (scalar): the backward's dw partial sums are too wide
  // for shared memory without an opt-in and add up in global memory; 40 rows are two chunks.
  const std::int64_t hidden = GENERATE(320, 100, 16384, 12100);
  INFO("hidden " << hidden);
  const std::int64_t rows = hidden > 4096 ? 40 : 100;
  l3::test::Random rnd(103);
  const auto x = round_bf16(rnd.normal(rows * hidden, 2.0F));
  const auto w = round_bf16(rnd.uniform(hidden, 0.5F, 1.5F));
  const auto dout = round_bf16(rnd.normal(rows * hidden));
  const auto dx0 = round_bf16(rnd.normal(rows * hidden));  // dx accumulates
  std::vector<float> y(rows * hidden), rstd(rows), dx = dx0, dw(hidden, 0.0F);
  l3::kernels::cpu::rmsnorm(y, rstd, x, w, hidden, 1e-5F);
  l3::kernels::cpu::rmsnorm_backward(dx, dw, dout, x, w, rstd, hidden);

  const auto gx = upload(gpu, x, {rows, hidden}), gw = upload(gpu, w),
             gdout = upload(gpu, dout, {rows, hidden}), gdx = upload(gpu, dx0, {rows, hidden});
  const auto gy = poisoned(gpu, {rows, hidden}), grstd = poisoned(gpu, rows, DType::f32);
  const auto gdw = upload(gpu, std::vector<float>(hidden, 0.0F));
  gpu.rmsnorm(
      {.out = gy.view(), .rstd = grstd.view(), .x = gx.view(), .w = gw.view(), .eps = 1e-5F});
  gpu.rmsnorm_backward({.dx = gdx.view(),
                        .dw = gdw.view(),
                        .dout = gdout.view(),
                        .x = gx.view(),
                        .w = gw.view(),
                        .rstd = grstd.view()});
  expect_close("out", download(gpu, gy.view()), y, 1e-2);
  expect_close("rstd", download(gpu, grstd.view()), rstd, 1e-5);
  expect_close("dx", download(gpu, gdx.view()), dx, 1e-2);
  expect_close("dw", download(gpu, gdw.view()), dw, 1e-2);
}

TEST_CASE("rope forward and backward with llama3 scaling", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  l3::model::ModelConfig c = l3::model::preset("llama3.2-1b");
  const int heads = 4, hd = c.head_dim;
  const std::int64_t n = 200;
  const auto table = l3::model::make_rope_table(c, 256);
  l3::test::Random rnd(104);
  const auto positions = rnd.integers(n, 256);
  const auto x = round_bf16(rnd.normal(n * heads * hd));
  auto y = x;
  l3::kernels::cpu::rope(y, positions, table.cos, table.sin, heads, hd);
  auto dx = x;
  l3::kernels::cpu::rope_backward(dx, positions, table.cos, table.sin, heads, hd);

  const l3::kernels::Shape table_shape{table.positions, table.half};
  const auto gcos = upload(gpu, table.cos, table_shape, DType::f32),
             gsin = upload(gpu, table.sin, table_shape, DType::f32);
  const auto gpos = upload_raw(gpu, positions);
  // x 16-byte aligned (the vectorised kernel), and 2 bytes past that (the one-pair kernel): the
  // two agree with the CPU and with each other bit for bit.
  std::vector<std::vector<float>> forward, backward;
  for (const std::int64_t skew : {0, 1}) {
    INFO("skew " << skew);
    std::vector<float> padded(x.size() + static_cast<std::size_t>(skew), 0.0F);
    std::copy(x.begin(), x.end(), padded.begin() + skew);
    const auto gy = upload(gpu, padded), gdx = upload(gpu, padded);
    const auto y_at = gy.slice(skew, n * heads * hd).reshape({n, heads, hd}),
               dx_at = gdx.slice(skew, n * heads * hd).reshape({n, heads, hd});
    gpu.rope({.x = y_at, .positions = gpos.view(), .cos = gcos.view(), .sin = gsin.view()});
    gpu.rope_backward(
        {.x = dx_at, .positions = gpos.view(), .cos = gcos.view(), .sin = gsin.view()});
    forward.push_back(download(gpu, y_at));
    backward.push_back(download(gpu, dx_at));
    expect_close("rope", forward.back(), y, 1e-2);
    expect_close("rope backward", backward.back(), dx, 1e-2);
  }
  CHECK((forward[0] == forward[1]));
  CHECK((backward[0] == backward[1]));
}

TEST_CASE("dropout drops the CPU backend's elements and scales like it", "[gpu][lora]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  l3::kernels::CpuOps cpu;
  const std::int64_t n = 10007;
  l3::test::Random rnd(115);
  const auto x = round_bf16(rnd.normal(n));
  for (const float p : {0.0F, 0.1F, 0.5F}) {
    INFO("p " << p);
    std::vector<float> expected(n);
    cpu.dropout({.out = l3::kernels::TensorView(std::span<float>(expected)),
                 .x = l3::kernels::ConstTensorView(std::span<const float>(x)),
                 .p = p,
                 .scale = 2.0F,
                 .seed = 99});
    const auto b = upload(gpu, x);
    gpu.dropout({.out = b.view(), .x = b.view(), .p = p, .scale = 2.0F, .seed = 99});  // in place
    const auto got = download(gpu, b.view());
    // the same mask; each kept value x * 2 / (1 - p) computed in fp32, then rounded to bf16
    for (std::int64_t i = 0; i < n; ++i) {
      REQUIRE(got[static_cast<std::size_t>(i)] ==
              round_bf16(expected[static_cast<std::size_t>(i)]));
    }
  }
}

TEST_CASE("swiglu forward and backward", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // The vectorised bulk and the scalar tail (10007 = 8 x 1250 + 7), and a buffer starting
  // 2 bytes past a 16-byte boundary (all scalar).
  const std::int64_t skew = GENERATE(0, 1);
  INFO("skew " << skew);
  const std::int64_t n = 10007;
  l3::test::Random rnd(105);
  const auto gate = round_bf16(rnd.normal(n, 3.0F)), up = round_bf16(rnd.normal(n));
  const auto dout = round_bf16(rnd.normal(n));
  std::vector<float> out(n), dgate(n), dup(n);
  l3::kernels::cpu::swiglu(out, gate, up);
  l3::kernels::cpu::swiglu_backward(dgate, dup, dout, gate, up);
  auto skewed = [&](const std::vector<float>& v) {
    std::vector<float> padded(v.size() + static_cast<std::size_t>(skew), 0.0F);
    std::copy(v.begin(), v.end(), padded.begin() + skew);
    return upload(gpu, padded);
  };
  const auto gg = skewed(gate), gu = skewed(up), gd = skewed(dout);
  const auto go = poisoned(gpu, n + skew), gdg = poisoned(gpu, n + skew),
             gdu = poisoned(gpu, n + skew);
  auto at = [&](const l3::kernels::Buffer& b) { return b.slice(skew, n); };
  gpu.swiglu({.out = at(go), .gate = at(gg), .up = at(gu)});
  gpu.swiglu_backward(
      {.dgate = at(gdg), .dup = at(gdu), .dout = at(gd), .gate = at(gg), .up = at(gu)});
  expect_close("out", download(gpu, at(go)), out, 1e-2);
  expect_close("dgate", download(gpu, at(gdg)), dgate, 1e-2);
  expect_close("dup", download(gpu, at(gdu)), dup, 1e-2);
}

TEST_CASE("fallback attention forward and backward (causal, GQA, packed)", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  const std::vector<std::int32_t> cu = {0, 37, 40, 300, 301, 420};
  const std::int64_t n = cu.back();
  const l3::kernels::cpu::AttentionHeads h{8, 2, 64};
  l3::test::Random rnd(106);
  const auto q = round_bf16(rnd.normal(n * 8 * 64)), k = round_bf16(rnd.normal(n * 2 * 64));
  const auto v = round_bf16(rnd.normal(n * 2 * 64)), dout = round_bf16(rnd.normal(n * 8 * 64));
  std::vector<float> out(q.size()), lse(n * 8), dq(q.size()), dk(k.size()), dv(v.size());
  l3::kernels::cpu::attention(out, lse, q, k, v, cu, h);
  const auto out_b = round_bf16(out);  // the GPU's backward reads its bf16 output
  l3::kernels::cpu::attention_backward(dq, dk, dv, dout, out_b, lse, q, k, v, cu, h);

  const auto gq = upload(gpu, q, {n, 8, 64}), gk = upload(gpu, k, {n, 2, 64}),
             gv = upload(gpu, v, {n, 2, 64}), gdo = upload(gpu, dout, {n, 8, 64});
  const auto gcu = upload_raw(gpu, cu);
  // The longest segment: 300 - 40.
  const l3::kernels::PackedSegments segments{.cu_seqlens = gcu.view(), .max_segment = 260};
  const auto gout = poisoned(gpu, {n, 8, 64}), glse = poisoned(gpu, {8, n}, DType::f32);
  gpu.attention({.out = gout.view(),
                 .lse = glse.view(),
                 .q = gq.view(),
                 .k = gk.view(),
                 .v = gv.view(),
                 .segments = segments});
  expect_close("out", download(gpu, gout.view()), out, 2e-2);
  expect_close("lse", download(gpu, glse.view()), lse, 1e-3);
  const auto gdq = poisoned(gpu, {n, 8, 64}), gdk = poisoned(gpu, {n, 2, 64}),
             gdv = poisoned(gpu, {n, 2, 64});
  gpu.attention_backward({.dq = gdq.view(),
                          .dk = gdk.view(),
                          .dv = gdv.view(),
                          .dout = gdo.view(),
                          .out = gout.view(),
                          .lse = glse.view(),
                          .q = gq.view(),
                          .k = gk.view(),
                          .v = gv.view(),
                          .segments = segments});
  expect_close("dq", download(gpu, gdq.view()), dq, 3e-2);
  expect_close("dk", download(gpu, gdk.view()), dk, 3e-2);
  expect_close("dv", download(gpu, gdv.view()), dv, 3e-2);
}

TEST_CASE("fused lm_head + masked cross-entropy", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // vocab 5000, hidden 128: float4 logit rows, 16-byte row gathers; 5001 and 100: one value at
  // a time.
  const std::int64_t vocab = GENERATE(5000, 5001);
  const std::int64_t hidden = vocab == 5000 ? 128 : 100;
  INFO("vocab " << vocab << ", hidden " << hidden);
  const std::int64_t n = 300;
  l3::test::Random rnd(107);
  const auto h = round_bf16(rnd.normal(n * hidden)),
             w = round_bf16(rnd.normal(vocab * hidden, 0.1F));
  const auto targets = rnd.integers(n, static_cast<std::int32_t>(vocab));
  std::vector<std::int32_t> rows, row_targets;  // every third position is not counted
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % 3 == 0) continue;
    rows.push_back(static_cast<std::int32_t>(i));
    row_targets.push_back(targets[i]);
  }
  const float scale = 0.01F;
  std::vector<float> dh(n * hidden), dw(vocab * hidden, 0.0F);
  const auto cpu = l3::kernels::cpu::lm_head_cross_entropy(dh, dw, h, w, rows, row_targets, vocab,
                                                           hidden, scale);

  const auto gh = upload(gpu, h, {n, hidden}), gw = upload(gpu, w, {vocab, hidden});
  const auto gr = upload_raw(gpu, rows), gt = upload_raw(gpu, row_targets);
  const auto gdh = poisoned(gpu, {n, hidden});
  const auto gdw = upload(gpu, std::vector<float>(vocab * hidden, 0.0F), {vocab, hidden});
  // The loss adds to what the sum holds: start from 1.5.
  const auto gsum = upload_raw(gpu, std::vector<double>{1.5});
  gpu.lm_head_cross_entropy({.loss_sum = gsum.view(),
                             .dh = gdh.view(),
                             .dw = gdw.view(),
                             .h = gh.view(),
                             .w = gw.view(),
                             .rows = gr.view(),
                             .targets = gt.view(),
                             .grad_scale = scale});
  CHECK(download_raw<double>(gpu, gsum.view()).at(0) - 1.5 == Approx(cpu.loss).epsilon(1e-4));
  expect_close("dh", download(gpu, gdh.view()), dh, 2e-2);
  expect_close("dw", download(gpu, gdw.view()), dw, 2e-2);
  const auto fsum = upload_raw(gpu, std::vector<double>{0.0});
  gpu.lm_head_cross_entropy({.loss_sum = fsum.view(),
                             .h = gh.view(),
                             .w = gw.view(),
                             .rows = gr.view(),
                             .targets = gt.view()});
  CHECK(download_raw<double>(gpu, fsum.view()).at(0) == Approx(cpu.loss).epsilon(1e-4));
  // Logits divided by a sampling temperature (GRPO's): the CPU's loss and gradients with the
  // same logit_scale.
  {
    const float t_scale = l3::kernels::logit_scale(0.7);
    std::vector<float> dht(n * hidden), dwt(vocab * hidden, 0.0F);
    const auto cpu_t = l3::kernels::cpu::lm_head_cross_entropy(
        dht, dwt, h, w, rows, row_targets, vocab, hidden, scale, {.logit_scale = t_scale});
    const auto tsum = upload_raw(gpu, std::vector<double>{0.0});
    const auto gdwt = upload(gpu, std::vector<float>(vocab * hidden, 0.0F), {vocab, hidden});
    gpu.lm_head_cross_entropy({.loss_sum = tsum.view(),
                               .dh = gdh.view(),
                               .dw = gdwt.view(),
                               .h = gh.view(),
                               .w = gw.view(),
                               .rows = gr.view(),
                               .targets = gt.view(),
                               .grad_scale = scale,
                               .logit_scale = t_scale});
    CHECK(download_raw<double>(gpu, tsum.view()).at(0) == Approx(cpu_t.loss).epsilon(1e-4));
    CHECK(std::abs(cpu_t.loss - cpu.loss) > 1e-2 * std::abs(cpu.loss));
    expect_close("dh at T = 0.7", download(gpu, gdh.view()), dht, 2e-2);
    expect_close("dw at T = 0.7", download(gpu, gdwt.view()), dwt, 2e-2);
  }
  // Nothing counted: dh all zero, the sum unchanged.
  gpu.lm_head_cross_entropy({.loss_sum = fsum.view(),
                             .dh = gdh.view(),
                             .dw = gdw.view(),
                             .h = gh.view(),
                             .w = gw.view(),
                             .rows = gr.first(0),
                             .targets = gt.first(0),
                             .grad_scale = scale});
  CHECK(download_raw<double>(gpu, fsum.view()).at(0) == Approx(cpu.loss).epsilon(1e-4));
  const auto zeros = download(gpu, gdh.view());
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](float x) { return x == 0.0F; }));
}

TEST_CASE("fused lm_head cross-entropy: per-row losses and gradient weights", "[gpu]") {
  // DPO's use of the op: each counted row's loss read out (row_loss), each row's gradient weighed
  // by its sequence's (row_scale: of either sign, some 0), the summed loss optional.
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  const std::int64_t vocab = GENERATE(5000, 5001);
  const std::int64_t hidden = vocab == 5000 ? 128 : 100;
  INFO("vocab " << vocab << ", hidden " << hidden);
  const std::int64_t n = 200;
  l3::test::Random rnd(112);
  const auto h = round_bf16(rnd.normal(n * hidden)),
             w = round_bf16(rnd.normal(vocab * hidden, 0.1F));
  const auto targets = rnd.integers(n, static_cast<std::int32_t>(vocab));
  std::vector<std::int32_t> rows, row_targets;  // every third position is not counted
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % 3 == 0) continue;
    rows.push_back(static_cast<std::int32_t>(i));
    row_targets.push_back(targets[i]);
  }
  const auto counted = static_cast<std::int64_t>(rows.size());
  auto row_scale = rnd.uniform(counted, -2.0F, 2.0F);
  for (std::size_t c = 0; c < row_scale.size(); c += 7) row_scale[c] = 0.0F;
  const float scale = 0.01F;
  std::vector<float> dh(n * hidden), dw(vocab * hidden, 0.0F), row_loss(counted);
  const auto cpu =
      l3::kernels::cpu::lm_head_cross_entropy(dh, dw, h, w, rows, row_targets, vocab, hidden, scale,
                                              {.loss = row_loss, .scale = row_scale});

  const auto gh = upload(gpu, h, {n, hidden}), gw = upload(gpu, w, {vocab, hidden});
  const auto gr = upload_raw(gpu, rows), gt = upload_raw(gpu, row_targets);
  const auto gscale = upload(gpu, row_scale, DType::f32);
  const auto gdh = poisoned(gpu, {n, hidden});
  const auto gdw = upload(gpu, std::vector<float>(vocab * hidden, 0.0F), {vocab, hidden});
  const auto gloss = poisoned(gpu, counted, DType::f32);
  // No loss_sum: the row losses only.
  gpu.lm_head_cross_entropy({.dh = gdh.view(),
                             .dw = gdw.view(),
                             .row_loss = gloss.view(),
                             .h = gh.view(),
                             .w = gw.view(),
                             .rows = gr.view(),
                             .targets = gt.view(),
                             .row_scale = gscale.view(),
                             .grad_scale = scale});
  const auto got = download(gpu, gloss.view());
  expect_close("row_loss", got, row_loss, 1e-4);
  double total = 0.0;
  for (const float x : got) total += static_cast<double>(x);
  CHECK(total == Approx(cpu.loss).epsilon(1e-4));
  expect_close("dh (weighted rows)", download(gpu, gdh.view()), dh, 2e-2);
  expect_close("dw (weighted rows)", download(gpu, gdw.view()), dw, 2e-2);
  // Rows weighed 0 give nothing to dh.
  const auto gdh_host = download(gpu, gdh.view());
  for (std::size_t c = 0; c < row_scale.size(); c += 7) {
    const auto at = static_cast<std::size_t>(rows[c]) * static_cast<std::size_t>(hidden);
    CHECK(std::all_of(gdh_host.begin() + static_cast<std::ptrdiff_t>(at),
                      gdh_host.begin() + static_cast<std::ptrdiff_t>(at + hidden),
                      [](float x) { return x == 0.0F; }));
  }

  // The forward with both the sum and the row losses: row_scale does not weigh the loss.
  const auto gsum = upload_raw(gpu, std::vector<double>{1.5});
  const auto gloss2 = poisoned(gpu, counted, DType::f32);
  gpu.lm_head_cross_entropy({.loss_sum = gsum.view(),
                             .row_loss = gloss2.view(),
                             .h = gh.view(),
                             .w = gw.view(),
                             .rows = gr.view(),
                             .targets = gt.view(),
                             .row_scale = gscale.view()});
  CHECK(download_raw<double>(gpu, gsum.view()).at(0) - 1.5 == Approx(cpu.loss).epsilon(1e-4));
  CHECK((download(gpu, gloss2.view()) == got));  // the same kernels: the same values
  // Without row_scale: the unweighted gradient, as before.
  std::vector<float> dh1(n * hidden), dw1(vocab * hidden, 0.0F);
  (void)l3::kernels::cpu::lm_head_cross_entropy(dh1, dw1, h, w, rows, row_targets, vocab, hidden,
                                                scale);
  const auto gdw1 = upload(gpu, std::vector<float>(vocab * hidden, 0.0F), {vocab, hidden});
  gpu.lm_head_cross_entropy({.dh = gdh.view(),
                             .dw = gdw1.view(),
                             .row_loss = gloss2.view(),
                             .h = gh.view(),
                             .w = gw.view(),
                             .rows = gr.view(),
                             .targets = gt.view(),
                             .grad_scale = scale});
  expect_close("dh (unweighted)", download(gpu, gdh.view()), dh1, 2e-2);
  expect_close("dw (unweighted)", download(gpu, gdw1.view()), dw1, 2e-2);
}

TEST_CASE("weight gradients add into fp32 buffers without a bf16 rounding", "[gpu]") {
  // --grad-accum-dtype fp32: every op that adds into a weight gradient (GEMM dW, embedding,
  // RMSNorm, score head, lm_head) takes an fp32 buffer too. Each buffer starts at values bf16
  // cannot hold, and must end at them plus the op's gradient in fp32: a rounding to bf16 (about
  // 2e-3) or bf16 bits written into it fail.
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  l3::test::Random rnd(111);
  const auto start = [&](std::int64_t count) { return rnd.normal(count, 3.0F); };
  const auto f32 = [&](const std::vector<float>& values) {
    return upload(gpu, values, DType::f32);
  };

  SECTION("matmul dW") {
    const std::int64_t m = 77, n = 96, k = 136;
    const auto x = round_bf16(rnd.normal(m * k)), w = round_bf16(rnd.normal(n * k, 0.1F));
    const auto dy = round_bf16(rnd.normal(m * n));
    auto dw = start(n * k);
    const auto gdw = upload(gpu, dw, {n, k}, DType::f32);
    std::vector<float> dx(m * k);
    l3::kernels::cpu::matmul_backward(dx, dw, dy, x, w, m, n, k, false);
    gpu.matmul_backward({.dw = gdw.view(),
                         .dy = upload(gpu, dy, {m, n}).view(),
                         .x = upload(gpu, x, {m, k}).view(),
                         .w = upload(gpu, w, {n, k}).view()});
    expect_close("dw (fp32)", download(gpu, gdw.view()), dw, 1e-5);
  }
  SECTION("embedding") {
    const std::int64_t vocab = 300, hidden = 64, n = 1000;
    const auto tokens = rnd.integers(n, 50);
    const auto dout = round_bf16(rnd.normal(n * hidden));
    auto dtable = start(vocab * hidden);
    const auto gdtable = upload(gpu, dtable, {vocab, hidden}, DType::f32);
    l3::kernels::cpu::embedding_backward(dtable, tokens, dout, hidden);
    gpu.embedding_backward({.dtable = gdtable.view(),
                            .tokens = upload_raw(gpu, tokens).view(),
                            .dout = upload(gpu, dout, {n, hidden}).view()});
    expect_close("dtable (fp32)", download(gpu, gdtable.view()), dtable, 1e-5);
  }
  SECTION("rmsnorm") {
    const std::int64_t rows = 100, hidden = GENERATE(320, 100);
    INFO("hidden " << hidden);
    const auto x = round_bf16(rnd.normal(rows * hidden, 2.0F));
    const auto w = round_bf16(rnd.uniform(hidden, 0.5F, 1.5F));
    const auto dout = round_bf16(rnd.normal(rows * hidden));
    std::vector<float> y(rows * hidden), rstd(rows), dx(rows * hidden, 0.0F);
    auto dw = start(hidden);
    const auto gdw = f32(dw);
    l3::kernels::cpu::rmsnorm(y, rstd, x, w, hidden, 1e-5F);
    l3::kernels::cpu::rmsnorm_backward(dx, dw, dout, x, w, rstd, hidden);
    const auto gx = upload(gpu, x, {rows, hidden}), gw = upload(gpu, w);
    const auto gy = poisoned(gpu, {rows, hidden}), grstd = poisoned(gpu, rows, DType::f32);
    const auto gdx = upload(gpu, std::vector<float>(rows * hidden, 0.0F), {rows, hidden});
    gpu.rmsnorm(
        {.out = gy.view(), .rstd = grstd.view(), .x = gx.view(), .w = gw.view(), .eps = 1e-5F});
    gpu.rmsnorm_backward({.dx = gdx.view(),
                          .dw = gdw.view(),
                          .dout = upload(gpu, dout, {rows, hidden}).view(),
                          .x = gx.view(),
                          .w = gw.view(),
                          .rstd = grstd.view()});
    expect_close("dw (fp32)", download(gpu, gdw.view()), dw, 1e-5);
  }
  SECTION("score head") {
    const std::int64_t n = 50, hidden = 256;
    const auto h = round_bf16(rnd.normal(n * hidden)), w = round_bf16(rnd.normal(hidden));
    const std::vector<std::int32_t> rows = {3, 49, 0, 17};
    const std::vector<float> ds = {0.5F, -1.0F, 0.25F, 2.0F};
    std::vector<float> dh(n * hidden, 0.0F);
    auto dw = start(hidden);
    const auto gdw = f32(dw);
    l3::kernels::cpu::gather_dot_backward(dh, dw, ds, h, w, rows, hidden);
    const auto gdh = upload(gpu, std::vector<float>(n * hidden, 0.0F), {n, hidden});
    gpu.gather_dot_backward({.dh = gdh.view(),
                             .dw = gdw.view(),
                             .dscores = upload(gpu, ds, DType::f32).view(),
                             .h = upload(gpu, h, {n, hidden}).view(),
                             .w = upload(gpu, w).view(),
                             .rows = upload_raw(gpu, rows).view()});
    expect_close("dw (fp32)", download(gpu, gdw.view()), dw, 1e-5);
  }
  SECTION("lm_head") {
    // dlogits pass through bf16 before the dW GEMM, so the gradient itself is within bf16
    // tolerance of the CPU's; what is checked is that it lands on the fp32 start values.
    const std::int64_t vocab = 5000, hidden = 128, n = 300;
    const auto h = round_bf16(rnd.normal(n * hidden)),
               w = round_bf16(rnd.normal(vocab * hidden, 0.1F));
    const auto targets = rnd.integers(n, static_cast<std::int32_t>(vocab));
    std::vector<std::int32_t> rows(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      rows[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    std::vector<float> dh(n * hidden), dw(vocab * hidden, 0.0F);
    (void)l3::kernels::cpu::lm_head_cross_entropy(dh, dw, h, w, rows, targets, vocab, hidden,
                                                  0.01F);
    const auto dw0 = start(vocab * hidden);
    const auto gdw = upload(gpu, dw0, {vocab, hidden}, DType::f32);
    const auto gsum = upload_raw(gpu, std::vector<double>{0.0});
    const auto gdh = poisoned(gpu, {n, hidden});
    gpu.lm_head_cross_entropy({.loss_sum = gsum.view(),
                               .dh = gdh.view(),
                               .dw = gdw.view(),
                               .h = upload(gpu, h, {n, hidden}).view(),
                               .w = upload(gpu, w, {vocab, hidden}).view(),
                               .rows = upload_raw(gpu, rows).view(),
                               .targets = upload_raw(gpu, targets).view(),
                               .grad_scale = 0.01F});
    auto added = download(gpu, gdw.view());
    for (std::size_t i = 0; i < added.size(); ++i) added[i] -= dw0[i];
    expect_close("dw (fp32) minus its start", added, dw, 2e-2);
  }
}

TEST_CASE("Bradley-Terry loss on the device", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  const std::int64_t pairs = 700;  // more than one pass of the block's threads
  l3::test::Random rnd(109);
  const auto scores = rnd.normal(2 * pairs, 2.0F);
  const auto margins = rnd.normal(pairs, 0.5F);
  const double center = 0.01;
  const float scale = 1.0F / 700.0F;
  std::vector<float> dc(pairs), dr(pairs);
  const std::span<const float> all(scores);
  const auto ref = l3::kernels::cpu::bradley_terry(all.first(pairs), all.last(pairs), margins,
                                                   center, scale, dc, dr);
  const auto gs = upload(gpu, scores, DType::f32), gm = upload(gpu, margins, DType::f32);
  const auto gd = poisoned(gpu, 2 * pairs, DType::f32);
  const auto gsums = upload_raw(gpu, std::vector<double>{1.0, 2.0, 3.0});
  gpu.bradley_terry({.sums = gsums.view(),
                     .d_scores = gd.view(),
                     .scores = gs.view(),
                     .margins = gm.view(),
                     .center = center,
                     .grad_scale = scale});
  const auto sums = download_raw<double>(gpu, gsums.view());
  CHECK(sums[0] - 1.0 == Approx(ref.loss).epsilon(1e-12));
  CHECK(sums[1] - 2.0 == static_cast<double>(ref.correct));
  CHECK(sums[2] - 3.0 == Approx(ref.margin).epsilon(1e-12));
  std::vector<float> d(dc);
  d.insert(d.end(), dr.begin(), dr.end());
  expect_close("d_scores", download(gpu, gd.view()), d, 1e-6);
  // Without margins or gradients: the sums only.
  const auto plain =
      l3::kernels::cpu::bradley_terry(all.first(pairs), all.last(pairs), {}, 0.0, 1.0F, {}, {});
  const auto gp = upload_raw(gpu, std::vector<double>{0.0, 0.0, 0.0});
  gpu.bradley_terry({.sums = gp.view(), .scores = gs.view()});
  const auto psums = download_raw<double>(gpu, gp.view());
  CHECK(psums[0] == Approx(plain.loss).epsilon(1e-12));
  CHECK(psums[1] == static_cast<double>(plain.correct));
}

namespace {

// Counted rows for 2P sequences of DPO: segments of 0 to 8 rows with gaps of 0 or 1 rows between
// them (rows of no sequence) and sequence 5 empty; the sequences take the segments in a shuffled
// order (chosen and rejected need not be neighbours). Returns the ranges; `rows` gets C.
std::vector<l3::kernels::cpu::RowRange> dpo_ranges(l3::test::Random& rnd, std::int64_t sequences,
                                                   std::int64_t& rows) {
  const auto lengths = rnd.integers(sequences, 9);
  const auto gaps = rnd.integers(sequences, 2);
  std::vector<l3::kernels::cpu::RowRange> segments;
  std::int32_t at = 0;
  for (std::int64_t s = 0; s < sequences; ++s) {
    at += gaps[s];
    const std::int32_t length = s == 5 ? 0 : lengths[s];
    segments.push_back({at, at + length});
    at += length;
  }
  rows = at + 3;  // and a tail of rows of no sequence
  const auto order = rnd.integers(sequences, 1 << 30);
  std::vector<std::size_t> index(segments.size());
  for (std::size_t i = 0; i < index.size(); ++i) index[i] = i;
  std::sort(index.begin(), index.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(order[a], a) < std::pair(order[b], b);
  });
  std::vector<l3::kernels::cpu::RowRange> ranges;
  for (const std::size_t i : index) ranges.push_back(segments[i]);
  return ranges;
}

l3::kernels::Buffer upload_ranges(l3::cuda::CudaOps& gpu,
                                  const std::vector<l3::kernels::cpu::RowRange>& ranges) {
  std::vector<std::int32_t> flat;
  for (const auto& r : ranges) {
    flat.push_back(r.begin);
    flat.push_back(r.end);
  }
  auto b = upload_raw(gpu, flat);
  b.reshape({static_cast<std::int64_t>(ranges.size()), 2});
  return b;
}

}  // namespace

TEST_CASE("sequence log-probabilities and the DPO loss on the device", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  namespace cpu = l3::kernels::cpu;
  l3::cuda::CudaOps gpu;
  const std::int64_t pairs = 300;  // more than one chunk of the block's threads
  l3::test::Random rnd(113);
  std::int64_t rows = 0;
  const auto ranges = dpo_ranges(rnd, 2 * pairs, rows);
  INFO(rows << " counted rows");
  const auto row_loss = rnd.uniform(rows, 0.0F, 6.0F);
  const auto gloss = upload(gpu, row_loss, DType::f32);
  const auto granges = upload_ranges(gpu, ranges);
  const std::vector<double> nan_logps(2 * pairs, std::numeric_limits<double>::quiet_NaN());

  // Log-probabilities: sums and per-token means (an empty range: 0).
  for (const bool mean : {false, true}) {
    INFO("mean " << mean);
    std::vector<double> want(2 * pairs);
    cpu::sequence_log_probs(want, row_loss, ranges, mean);
    const auto glogps = upload_raw(gpu, nan_logps);
    gpu.sequence_log_probs(
        {.logps = glogps.view(), .row_loss = gloss.view(), .ranges = granges.view(), .mean = mean});
    const auto got = download_raw<double>(gpu, glogps.view());
    std::int64_t empty = 0;
    for (std::size_t s = 0; s < got.size(); ++s) {
      INFO("sequence " << s);
      REQUIRE(got[s] == Approx(want[s]).epsilon(1e-12));
      if (ranges[s].begin == ranges[s].end) {
        ++empty;
        CHECK(got[s] == 0.0);
      }
    }
    CHECK(empty >= 1);
  }

  // The reference model's log-probabilities: those of other row losses near the policy's.
  const auto kind = GENERATE(cpu::DpoKind::sigmoid, cpu::DpoKind::ipo);
  const bool ipo = kind == cpu::DpoKind::ipo;
  INFO((ipo ? "ipo" : "sigmoid"));
  auto ref_loss = row_loss;
  const auto noise = rnd.uniform(rows, -0.5F, 0.5F);
  for (std::size_t i = 0; i < ref_loss.size(); ++i) ref_loss[i] += noise[i];
  std::vector<double> reference(2 * pairs);
  cpu::sequence_log_probs(reference, ref_loss, ranges, ipo);
  const auto greference = upload_raw(gpu, reference);
  const double beta = 0.1;
  const double smoothing = ipo ? 0.0 : 0.1;
  const float scale = 1.0F / 300.0F;
  const auto loss = ipo ? l3::kernels::PreferenceLoss::ipo : l3::kernels::PreferenceLoss::sigmoid;

  std::vector<float> d_rows(rows);
  const auto want =
      cpu::dpo_loss(row_loss, ranges, reference, beta, smoothing, kind, scale, d_rows);
  // The sums add to what they hold.
  const auto gsums = upload_raw(gpu, std::vector<double>{1.0, 2.0, 3.0, 4.0});
  const auto gd = poisoned(gpu, rows, DType::f32);
  gpu.dpo_loss({.sums = gsums.view(),
                .d_rows = gd.view(),
                .row_loss = gloss.view(),
                .ranges = granges.view(),
                .reference = greference.view(),
                .beta = beta,
                .label_smoothing = smoothing,
                .loss = loss,
                .grad_scale = scale});
  const auto sums = download_raw<double>(gpu, gsums.view());
  CHECK(sums[0] - 1.0 == Approx(want.loss).epsilon(1e-12));
  CHECK(sums[1] - 2.0 == static_cast<double>(want.correct));
  CHECK(sums[2] - 3.0 == Approx(want.margin).epsilon(1e-12));
  CHECK(sums[3] - 4.0 == Approx(want.chosen).epsilon(1e-12));
  const auto got = download(gpu, gd.view());
  expect_close("d_rows", got, d_rows, 1e-6);
  // Rows of no sequence: 0 (the output started as NaN).
  std::vector<bool> covered(static_cast<std::size_t>(rows), false);
  for (const auto& r : ranges)
    for (std::int32_t i = r.begin; i < r.end; ++i) covered[static_cast<std::size_t>(i)] = true;
  std::int64_t uncovered = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (covered[i]) continue;
    ++uncovered;
    REQUIRE(got[i] == 0.0F);
  }
  CHECK(uncovered >= 3);

  // Without d_rows: the same sums.
  const auto gplain = upload_raw(gpu, std::vector<double>{0.0, 0.0, 0.0, 0.0});
  gpu.dpo_loss({.sums = gplain.view(),
                .row_loss = gloss.view(),
                .ranges = granges.view(),
                .reference = greference.view(),
                .beta = beta,
                .label_smoothing = smoothing,
                .loss = loss,
                .grad_scale = scale});
  const auto plain = download_raw<double>(gpu, gplain.view());
  CHECK(plain[0] == Approx(want.loss).epsilon(1e-12));
  CHECK(plain[1] == static_cast<double>(want.correct));
  CHECK(plain[2] == Approx(want.margin).epsilon(1e-12));
  CHECK(plain[3] == Approx(want.chosen).epsilon(1e-12));

  // No pairs: d_rows all 0, the sums unchanged.
  const auto gnone = poisoned(gpu, rows, DType::f32);
  gpu.dpo_loss({.sums = gplain.view(),
                .d_rows = gnone.view(),
                .row_loss = gloss.view(),
                .ranges = granges.first(0),
                .reference = greference.first(0),
                .beta = beta,
                .label_smoothing = smoothing,
                .loss = loss,
                .grad_scale = scale});
  CHECK((download_raw<double>(gpu, gplain.view()) == plain));
  const auto zeros = download(gpu, gnone.view());
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](float x) { return x == 0.0F; }));
}

TEST_CASE("GRPO policy loss on the device", "[gpu][policy_loss]") {
  INFO("seed " << l3::test::test_seed());
  namespace cpu = l3::kernels::cpu;
  l3::cuda::CudaOps gpu;
  const std::int64_t rows = 1000;  // four rounds of the block's threads and a tail
  l3::test::Random rnd(114);
  const auto row_loss = rnd.uniform(rows, 0.0F, 6.0F);
  auto advantages = rnd.uniform(rows, -2.0F, 2.0F);
  for (std::size_t c = 0; c < advantages.size(); c += 11) advantages[c] = 0.0F;
  const auto weights = rnd.uniform(rows, 0.0F, 0.01F);
  const auto old_shift = rnd.uniform(rows, -0.6F, 0.6F);
  const auto ref_shift = rnd.uniform(rows, -0.5F, 0.5F);
  const auto sampled_shift = rnd.uniform(rows, -0.02F, 0.02F);
  const auto entropy = rnd.uniform(rows, 0.0F, 5.0F);
  std::vector<float> old_logps(rows), ref_row_loss(rows), sampled(rows);
  for (std::size_t c = 0; c < old_logps.size(); ++c) {
    old_logps[c] = -row_loss[c] + old_shift[c];
    ref_row_loss[c] = row_loss[c] - ref_shift[c];
    sampled[c] = -row_loss[c] + sampled_shift[c];
  }
  const bool with_old = GENERATE(false, true);
  const double beta = GENERATE(0.0, 0.04);
  INFO("old_logps " << with_old << ", beta " << beta);
  const cpu::PolicyParams params{
      .epsilon_low = 0.2, .epsilon_high = 0.28, .beta = beta, .grad_scale = 0.25F};
  const std::vector<float> none;
  std::vector<float> d_rows(rows);
  const cpu::PolicyStats want = cpu::policy_loss({.row_loss = row_loss,
                                                  .advantages = advantages,
                                                  .weights = weights,
                                                  .old_logps = with_old ? old_logps : none,
                                                  .ref_row_loss = ref_row_loss,
                                                  .sampled_logps = sampled,
                                                  .row_entropy = entropy},
                                                 params, d_rows);
  if (with_old) {
    CHECK(want.low > 0);
    CHECK(want.high > 0);
  }
  const auto f32 = [&](const std::vector<float>& v) { return upload(gpu, v, DType::f32); };
  const auto gloss = f32(row_loss), gadv = f32(advantages), gweights = f32(weights),
             gold = f32(old_logps), gref = f32(ref_row_loss), gsampled = f32(sampled),
             gentropy = f32(entropy);
  // The sums add to what they hold; `largest` keeps the larger.
  const auto gsums = upload_raw(gpu, std::vector<double>{1.0, 2.0, 3.0, 4.0, 5.0});
  const auto glargest = upload_raw(gpu, std::vector<double>{1e-6});
  const auto gd = poisoned(gpu, rows, DType::f32);
  gpu.policy_loss({.sums = gsums.view(),
                   .largest = glargest.view(),
                   .d_rows = gd.view(),
                   .row_loss = gloss.view(),
                   .advantages = gadv.view(),
                   .weights = gweights.view(),
                   .old_logps = with_old ? gold.view() : l3::kernels::TensorView{},
                   .ref_row_loss = gref.view(),
                   .sampled_logps = gsampled.view(),
                   .row_entropy = gentropy.view(),
                   .epsilon_low = params.epsilon_low,
                   .epsilon_high = params.epsilon_high,
                   .beta = beta,
                   .grad_scale = params.grad_scale});
  // fp64 sums in another order than the CPU's: equal to rounding.
  const auto sums = download_raw<double>(gpu, gsums.view());
  CHECK(sums[0] - 1.0 == Approx(want.loss).epsilon(1e-10));
  CHECK(sums[1] - 2.0 == Approx(want.kl).epsilon(1e-10));
  CHECK(sums[2] - 3.0 == static_cast<double>(want.low));
  CHECK(sums[3] - 4.0 == static_cast<double>(want.high));
  CHECK(sums[4] - 5.0 == Approx(want.entropy).epsilon(1e-10));
  CHECK(download_raw<double>(gpu, glargest.view()).at(0) == want.largest);  // a max: exact
  expect_close("d_rows", download(gpu, gd.view()), d_rows, 1e-6);

  // A larger `largest` stays; without d_rows, sampled_logps and row_entropy the same loss.
  const auto gplain = upload_raw(gpu, std::vector<double>(5, 0.0));
  const auto gkept = upload_raw(gpu, std::vector<double>{7.0});
  gpu.policy_loss({.sums = gplain.view(),
                   .largest = gkept.view(),
                   .row_loss = gloss.view(),
                   .advantages = gadv.view(),
                   .weights = gweights.view(),
                   .old_logps = with_old ? gold.view() : l3::kernels::TensorView{},
                   .ref_row_loss = gref.view(),
                   .epsilon_low = params.epsilon_low,
                   .epsilon_high = params.epsilon_high,
                   .beta = beta});
  const auto plain = download_raw<double>(gpu, gplain.view());
  CHECK(plain[0] == Approx(want.loss).epsilon(1e-10));
  CHECK(plain[4] == 0.0);
  CHECK(download_raw<double>(gpu, gkept.view()).at(0) == 7.0);

  // No rows: nothing changes.
  gpu.policy_loss({.sums = gplain.view(),
                   .row_loss = gloss.first(0),
                   .advantages = gadv.first(0),
                   .weights = gweights.first(0)});
  CHECK((download_raw<double>(gpu, gplain.view()) == plain));
}

TEST_CASE("GRPO policy loss with importance sampling on the device", "[gpu][policy_loss]") {
  INFO("seed " << l3::test::test_seed());
  namespace cpu = l3::kernels::cpu;
  using l3::kernels::ImportanceSampling;
  l3::cuda::CudaOps gpu;
  l3::test::Random rnd(115);
  // 300 completions of 1-6 rows (more than the block's 256 threads) and one of 100: the
  // sequence modes' per-completion sums; 1000+ rows for the token modes.
  std::vector<std::int32_t> starts = {0};
  const auto lengths = rnd.integers(300, 6);
  for (const std::int32_t n : lengths) starts.push_back(starts.back() + n + 1);
  starts.push_back(starts.back() + 100);
  const auto rows = static_cast<std::size_t>(starts.back());
  const auto row_loss = rnd.uniform(rows, 0.0F, 6.0F);
  const auto advantages = rnd.uniform(rows, -2.0F, 2.0F);
  const auto weights = rnd.uniform(rows, 0.0F, 0.01F);
  const auto old_shift = rnd.uniform(rows, -0.6F, 0.6F);
  const auto ref_shift = rnd.uniform(rows, -0.5F, 0.5F);
  // token ratios 0.3 .. 3.3, sequence ratios beyond both bounds
  const auto sampled_shift = rnd.uniform(rows, -1.2F, 1.2F);
  std::vector<float> old_logps(rows), ref_row_loss(rows), sampled(rows);
  for (std::size_t c = 0; c < rows; ++c) {
    old_logps[c] = -row_loss[c] + old_shift[c];
    ref_row_loss[c] = row_loss[c] - ref_shift[c];
    sampled[c] = -row_loss[c] + sampled_shift[c];
  }
  const ImportanceSampling mode =
      GENERATE(ImportanceSampling::token_truncate, ImportanceSampling::token_mask,
               ImportanceSampling::sequence_truncate, ImportanceSampling::sequence_mask);
  const bool with_old = GENERATE(false, true);
  const bool sequence =
      mode == ImportanceSampling::sequence_truncate || mode == ImportanceSampling::sequence_mask;
  INFO("mode " << static_cast<int>(mode) << ", old_logps " << with_old);
  const cpu::PolicyParams params{.epsilon_low = 0.2,
                                 .epsilon_high = 0.28,
                                 .beta = 0.04,
                                 .importance_sampling = mode,
                                 .clip_min = 0.5,
                                 .clip_max = 3.0,
                                 .grad_scale = 0.25F};
  const std::vector<float> none;
  const std::vector<std::int32_t> no_starts;
  std::vector<float> d_rows(rows);
  const cpu::PolicyStats want =
      cpu::policy_loss({.row_loss = row_loss,
                        .advantages = advantages,
                        .weights = weights,
                        .old_logps = with_old ? old_logps : none,
                        .ref_row_loss = ref_row_loss,
                        .sampled_logps = sampled,
                        .completion_starts = sequence ? starts : no_starts},
                       params, d_rows);
  CHECK(want.rejected > 0);
  CHECK(want.ratio_min < want.ratio_max);
  const auto f32 = [&](const std::vector<float>& v) { return upload(gpu, v, DType::f32); };
  const auto gloss = f32(row_loss), gadv = f32(advantages), gweights = f32(weights),
             gold = f32(old_logps), gref = f32(ref_row_loss), gsampled = f32(sampled);
  const auto gstarts = upload_raw(gpu, starts);
  const auto gsums = upload_raw(gpu, std::vector<double>{1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0});
  const auto glargest = upload_raw(gpu, std::vector<double>{1e-6, 1e-6, 1e-6});
  const auto gd = poisoned(gpu, static_cast<std::int64_t>(rows), DType::f32);
  gpu.policy_loss({.sums = gsums.view(),
                   .largest = glargest.view(),
                   .d_rows = gd.view(),
                   .row_loss = gloss.view(),
                   .advantages = gadv.view(),
                   .weights = gweights.view(),
                   .old_logps = with_old ? gold.view() : l3::kernels::TensorView{},
                   .ref_row_loss = gref.view(),
                   .sampled_logps = gsampled.view(),
                   .completion_starts = sequence ? gstarts.view() : l3::kernels::TensorView{},
                   .epsilon_low = params.epsilon_low,
                   .epsilon_high = params.epsilon_high,
                   .beta = params.beta,
                   .importance_sampling = mode,
                   .clip_min = params.clip_min,
                   .clip_max = params.clip_max,
                   .grad_scale = params.grad_scale});
  const auto sums = download_raw<double>(gpu, gsums.view());
  CHECK(sums[0] - 1.0 == Approx(want.loss).epsilon(1e-10));
  CHECK(sums[1] - 2.0 == Approx(want.kl).epsilon(1e-10));
  CHECK(sums[2] - 3.0 == static_cast<double>(want.low));
  CHECK(sums[3] - 4.0 == static_cast<double>(want.high));
  CHECK(sums[4] == 5.0);
  CHECK(sums[5] - 6.0 == Approx(want.ratio_sum).epsilon(1e-10));
  CHECK(sums[6] - 7.0 == static_cast<double>(want.ratio_units));
  CHECK(sums[6] - 7.0 == static_cast<double>(sequence ? starts.size() - 1 : rows));
  CHECK(sums[7] - 8.0 == static_cast<double>(want.rejected));
  const auto largest = download_raw<double>(gpu, glargest.view());
  CHECK(largest[0] == want.largest);  // a max of differences: exact
  // the ratios: the device's exp, within an ulp or two of the host's
  CHECK(largest[1] == Approx(want.ratio_max).epsilon(1e-14));
  CHECK(largest[2] == Approx(1.0 / (1.0 + want.ratio_min)).epsilon(1e-14));
  expect_close("d_rows", download(gpu, gd.view()), d_rows, 1e-6);
}

TEST_CASE("fused lm_head cross-entropy: per-row entropies", "[gpu][policy_loss]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // float4 logit rows (5000) and one value at a time (5001).
  const std::int64_t vocab = GENERATE(5000, 5001);
  const std::int64_t hidden = vocab == 5000 ? 128 : 100;
  INFO("vocab " << vocab << ", hidden " << hidden);
  const std::int64_t n = 120;
  l3::test::Random rnd(115);
  // Larger weights for some rows than others: entropies from near log V to far below.
  const auto h = round_bf16(rnd.normal(n * hidden, 2.0F)),
             w = round_bf16(rnd.normal(vocab * hidden, 0.1F));
  const auto targets = rnd.integers(n, static_cast<std::int32_t>(vocab));
  std::vector<std::int32_t> rows, row_targets;  // every third position is not counted
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % 3 == 0) continue;
    rows.push_back(static_cast<std::int32_t>(i));
    row_targets.push_back(targets[i]);
  }
  const auto counted = static_cast<std::int64_t>(rows.size());
  std::vector<float> row_loss(counted), entropy(counted);
  (void)l3::kernels::cpu::lm_head_cross_entropy({}, {}, h, w, rows, row_targets, vocab, hidden,
                                                1.0F, {.loss = row_loss, .entropy = entropy});
  const auto gh = upload(gpu, h, {n, hidden}), gw = upload(gpu, w, {vocab, hidden});
  const auto gr = upload_raw(gpu, rows), gt = upload_raw(gpu, row_targets);
  const auto gloss = poisoned(gpu, counted, DType::f32);
  const auto gentropy = poisoned(gpu, counted, DType::f32);
  const auto gsum = upload_raw(gpu, std::vector<double>{0.0});
  gpu.lm_head_cross_entropy({.loss_sum = gsum.view(),
                             .row_loss = gloss.view(),
                             .row_entropy = gentropy.view(),
                             .h = gh.view(),
                             .w = gw.view(),
                             .rows = gr.view(),
                             .targets = gt.view()});
  expect_close("row_entropy", download(gpu, gentropy.view()), entropy, 1e-4);
  expect_close("row_loss", download(gpu, gloss.view()), row_loss, 1e-4);
  // The row losses are those of a call without entropies, bit for bit.
  const auto gloss2 = poisoned(gpu, counted, DType::f32);
  gpu.lm_head_cross_entropy({.row_loss = gloss2.view(),
                             .h = gh.view(),
                             .w = gw.view(),
                             .rows = gr.view(),
                             .targets = gt.view()});
  CHECK((download(gpu, gloss2.view()) == download(gpu, gloss.view())));
  // With the backward as well: the same entropies.
  const auto gdh = poisoned(gpu, {n, hidden});
  const auto gentropy2 = poisoned(gpu, counted, DType::f32);
  gpu.lm_head_cross_entropy({.dh = gdh.view(),
                             .row_entropy = gentropy2.view(),
                             .h = gh.view(),
                             .w = gw.view(),
                             .rows = gr.view(),
                             .targets = gt.view(),
                             .grad_scale = 0.01F});
  CHECK((download(gpu, gentropy2.view()) == download(gpu, gentropy.view())));
}

TEST_CASE("add_into: bf16 sums taken in fp32 and rounded once, or kept in fp32", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  // The vectorised bulk with a tail of 7, and a view 2 bytes off a 16-byte boundary (scalar).
  const std::int64_t skew = GENERATE(0, 1);
  INFO("skew " << skew);
  const std::int64_t n = 10007;
  l3::test::Random rnd(109);
  const auto a = round_bf16(rnd.normal(n + skew, 2.0F)), b = round_bf16(rnd.normal(n + skew));
  std::vector<float> want(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const std::size_t at = i + static_cast<std::size_t>(skew);
    want[i] = round_bf16(a[at] + b[at]);  // the kernel's fp32 sum, rounded once
  }
  const auto ga = upload(gpu, a), gb = upload(gpu, b);
  gpu.add_into(ga.slice(skew, n), gb.slice(skew, n));
  CHECK((download(gpu, ga.slice(skew, n)) == want));
  if (skew > 0) CHECK(download(gpu, ga.slice(0, 1))[0] == a[0]);  // outside the range: untouched

  // Into fp32 (ZeRO-2's reduced gradients): the fp32 sum kept, no rounding to bf16. The fp32
  // values carry bits bf16 has not, so a bf16 rounding anywhere shows.
  const auto acc = rnd.normal(n + skew, 2.0F);
  std::vector<float> kept(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const std::size_t at = i + static_cast<std::size_t>(skew);
    kept[i] = acc[at] + b[at];
  }
  const auto gacc = upload(gpu, acc, DType::f32);
  gpu.add_into(gacc.slice(skew, n), gb.slice(skew, n));
  CHECK((download(gpu, gacc.slice(skew, n)) == kept));
  if (skew > 0) CHECK(download(gpu, gacc.slice(0, 1))[0] == acc[0]);
}

TEST_CASE("score read-out, sum of squares, AdamW", "[gpu]") {
  INFO("seed " << l3::test::test_seed());
  l3::cuda::CudaOps gpu;
  const std::int64_t n = 50, hidden = 256;
  l3::test::Random rnd(108);
  const auto h = round_bf16(rnd.normal(n * hidden)), w = round_bf16(rnd.normal(hidden));
  const std::vector<std::int32_t> rows = {3, 49, 0, 17};
  const std::vector<float> ds = {0.5F, -1.0F, 0.25F, 2.0F};
  std::vector<float> scores(4), dh(n * hidden, 0.0F), dw(hidden, 0.0F);
  l3::kernels::cpu::gather_dot(scores, h, w, rows, hidden);
  l3::kernels::cpu::gather_dot_backward(dh, dw, ds, h, w, rows, hidden);
  const auto gh = upload(gpu, h, {n, hidden}), gw = upload(gpu, w), grows = upload_raw(gpu, rows);
  const auto gs = poisoned(gpu, 4, DType::f32), gds = upload(gpu, ds, DType::f32);
  const auto gdh = upload(gpu, std::vector<float>(n * hidden, 0.0F), {n, hidden});
  const auto gdw = upload(gpu, std::vector<float>(hidden, 0.0F));
  gpu.gather_dot({.scores = gs.view(), .h = gh.view(), .w = gw.view(), .rows = grows.view()});
  gpu.gather_dot_backward({.dh = gdh.view(),
                           .dw = gdw.view(),
                           .dscores = gds.view(),
                           .h = gh.view(),
                           .w = gw.view(),
                           .rows = grows.view()});
  expect_close("scores", download(gpu, gs.view()), scores, 1e-4);
  expect_close("dh", download(gpu, gdh.view()), dh, 1e-2);
  expect_close("dw", download(gpu, gdw.view()), dw, 1e-2);

  CHECK(gpu.sum_squares(gh.view()) == Approx(l3::kernels::cpu::sum_squares(h)).epsilon(1e-9));
  // 16-byte loads with a tail of 5, and an unaligned view (one value at a time).
  const std::span<const float> hs(h);
  CHECK(gpu.sum_squares(gh.slice(0, 1005)) ==
        Approx(l3::kernels::cpu::sum_squares(hs.first(1005))).epsilon(1e-9));
  CHECK(gpu.sum_squares(gh.slice(3, 1002)) ==
        Approx(l3::kernels::cpu::sum_squares(hs.subspan(3, 1002))).epsilon(1e-9));

  // AdamW on 1003 values (the four-wide kernel and a tail of 3), then the same with every
  // array one element off its 16-byte alignment (the one-wide kernel): both match the CPU and
  // each other bit for bit. Gradients in bf16, or in fp32 (ZeRO-2's accumulated shard: values
  // bf16 cannot hold, so that reading them as anything else fails).
  const DType grad_dtype = GENERATE(DType::bf16, DType::f32);
  INFO("gradients " << l3::kernels::dtype_name(grad_dtype));
  const std::int64_t count = 1003;
  const auto master0 = rnd.normal(count);
  const auto grads = grad_dtype == DType::bf16 ? round_bf16(rnd.normal(count)) : rnd.normal(count);
  const auto m0 = rnd.normal(count, 0.01F);
  auto v0 = rnd.normal(count, 0.01F);
  for (float& x : v0) x = x * x;
  const l3::kernels::AdamWParams hyper{1e-3F, 0.9F, 0.95F, 1e-8F, 0.1F, 0.5F, 3};
  auto master = master0, m = m0, v = v0;
  l3::kernels::cpu::adamw(master, grads, m, v, hyper);
  std::vector<std::vector<float>> masters, copies;
  for (const std::int64_t skew : {0, 1}) {
    INFO("skew " << skew);
    auto skewed = [&](const std::vector<float>& values, DType dtype) {
      std::vector<float> padded(values.size() + static_cast<std::size_t>(skew), 0.0F);
      std::copy(values.begin(), values.end(), padded.begin() + skew);
      return upload(gpu, padded, dtype);
    };
    const auto gmaster = skewed(master0, DType::f32), ggrads = skewed(grads, grad_dtype);
    const auto gm = skewed(m0, DType::f32), gv = skewed(v0, DType::f32);
    const auto gcopy = poisoned(gpu, count + skew);
    gpu.adamw({.params = gmaster.slice(skew, count),
               .params_copy = gcopy.slice(skew, count),
               .m = gm.slice(skew, count),
               .v = gv.slice(skew, count),
               .grads = ggrads.slice(skew, count),
               .hyper = hyper});
    masters.push_back(download(gpu, gmaster.slice(skew, count)));
    copies.push_back(download(gpu, gcopy.slice(skew, count)));
    expect_close("master", masters.back(), master, 1e-6);
    expect_close("m", download(gpu, gm.slice(skew, count)), m, 1e-6);
    expect_close("v", download(gpu, gv.slice(skew, count)), v, 1e-6);
    CHECK((copies.back() == round_bf16(masters.back())));
  }
  CHECK((masters[0] == masters[1]));
  CHECK((copies[0] == copies[1]));
}
