// The CUDA emulation (L3_CUDA=EMULATED) against its promises: it computes what a GPU computes for
// correct kernels, and exposes what a GPU might hide or do at random: a missing barrier, a
// barrier or full-mask shuffle some threads never reach, reads of unwritten shared memory,
// reliance on the order of blocks. Also the GEMM and memory calls the backend relies on.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "cuda_emulation.hpp"
#include "probe_kernels.hpp"

namespace probe = l3::emulation_probe;

namespace {
// Launches are queued on their stream: results (and a kernel's errors) come with a sync.
void finish() {
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("cudaDeviceSynchronize");
}
}  // namespace

TEST_CASE("emulated block reductions sum like the GPU", "[emulation]") {
  const int blocks = 7, threads = 256;
  std::vector<float> in(static_cast<std::size_t>(blocks * threads));
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 13) - 6.0F;
  std::vector<float> out(blocks, NAN);
  probe::block_sums(out.data(), in.data(), blocks, threads);
  finish();
  for (int b = 0; b < blocks; ++b) {
    const auto first = in.begin() + b * threads;
    CHECK(out[static_cast<std::size_t>(b)] == std::accumulate(first, first + threads, 0.0F));
  }
}

TEST_CASE("a missing barrier gives a wrong result", "[emulation]") {
  // Thread 0 reads the other threads' shared values with no __syncthreads between: in the
  // emulation's shuffled order most of them have not been written yet.
  const int blocks = 4, threads = 256;
  std::vector<float> in(static_cast<std::size_t>(blocks * threads), 1.0F);
  std::vector<float> out(blocks, NAN);
  probe::racy_sums(out.data(), in.data(), blocks, threads);
  finish();
  const auto right = std::count(out.begin(), out.end(), static_cast<float>(threads));
  CHECK(right < blocks);
}

TEST_CASE("barriers and shuffles that some threads never reach are errors", "[emulation]") {
  std::vector<float> out(64, 0.0F);
  CHECK_THROWS_WITH((probe::divergent_barrier(out.data()), finish()),
                    Catch::Contains("__syncthreads") && Catch::Contains("block (0, 0, 0)"));
  CHECK_THROWS_WITH((probe::barrier_after_exit(out.data()), finish()), Catch::Contains("exited"));
  CHECK_THROWS_WITH((probe::shuffle_with_exited_lane(out.data()), finish()),
                    Catch::Contains("shuffle"));
  // The emulation recovers: the next launch runs normally.
  std::vector<float> in(256, 2.0F), sums(1, NAN);
  probe::block_sums(sums.data(), in.data(), 1, 256);
  finish();
  CHECK(sums[0] == 512.0F);
}

TEST_CASE("a vector pointer cast from a misaligned address is an error", "[emulation]") {
  // A GPU faults on a 16-byte load from an address that is not a multiple of 16 (and the fault
  // ends its context); the host's loads do not care, so the emulation checks the cast.
  alignas(16) std::array<std::uint16_t, 16> in{};
  std::iota(in.begin(), in.end(), std::uint16_t{1});
  alignas(16) std::array<std::uint16_t, 8> out{};
  probe::vector_copy(out.data(), in.data());
  finish();
  CHECK(out[7] == 8);
  CHECK_THROWS_WITH((probe::vector_copy(out.data(), in.data() + 1), finish()),
                    Catch::Contains("misaligned address") && Catch::Contains("probe_kernels.cu") &&
                        Catch::Contains("aligned to 16"));
}

TEST_CASE("__shfl_xor_sync returns the partner lane's value", "[emulation]") {
  std::vector<int> out(64, -1);
  probe::shuffle_partner(out.data(), 64);
  finish();
  for (int t = 0; t < 64; ++t) CHECK(out[static_cast<std::size_t>(t)] == ((t % 32) ^ 3) * 10);
  CHECK_THROWS_WITH((probe::shuffle_partner(out.data(), 48), finish()),
                    Catch::Contains("not whole warps"));
}

TEST_CASE("dynamic shared memory starts as NaN in every block", "[emulation]") {
  std::vector<float> out(3 * 64, 0.0F);
  probe::dynamic_shared(out.data(), 3, 64);
  finish();
  CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::isnan(x); }));
}

TEST_CASE("blocks run once each, in a shuffled order", "[emulation]") {
  const int blocks = 64;
  std::vector<int> order(blocks, -1);
  int counter = 0;
  probe::block_order(order.data(), &counter, blocks);
  finish();
  CHECK(counter == blocks);
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> identity(blocks);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK((sorted == identity));  // a permutation
  CHECK_FALSE((order == identity));
}

TEST_CASE("built-in indices over a 2D grid of 3D blocks", "[emulation]") {
  const unsigned int gx = 3, gy = 2, bx = 8, by = 4, bz = 2;
  const unsigned int per_block = bx * by * bz;
  std::vector<int> out(gx * gy * per_block, -1);
  probe::indices(out.data(), gx, gy, bx, by, bz);
  finish();
  for (unsigned int b = 0; b < gx * gy; ++b)
    for (unsigned int t = 0; t < per_block; ++t)
      CHECK(out[b * per_block + t] == static_cast<int>(b * 1000 + t));
}

TEST_CASE("emulated cuBLASLt GEMM: bf16 in, fp32 accumulation, beta, transposes", "[emulation]") {
  // Column-major D (2 x 3) = A^T (2 x 4) B (4 x 3) + C, with A stored (4 x 2) in bf16.
  const std::vector<float> a_values = {1, 2, 3, 4, 5, 6, 7, 8};  // A (4 x 2), column-major
  std::vector<__nv_bfloat16> a(8);
  for (std::size_t i = 0; i < 8; ++i) a[i] = __float2bfloat16(a_values[i]);
  const std::vector<float> b = {1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1};  // B (4 x 3)
  std::vector<float> d = {10, 20, 30, 40, 50, 60};                    // C, then D (2 x 3)
  cublasLtHandle_t handle = nullptr;
  REQUIRE(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)) ==
          CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, 4, 2, 4) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 4, 3, 4) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, 2, 3, 2) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0F, beta = 1.0F;
  REQUIRE(cublasLtMatmul(handle, desc, &alpha, a.data(), la, b.data(), lb, &beta, d.data(), lc,
                         d.data(), lc, nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_SUCCESS);
  finish();
  const std::vector<float> c = {10, 20, 30, 40, 50, 60};
  std::vector<float> reference(6);
  for (int col = 0; col < 3; ++col) {
    for (int row = 0; row < 2; ++row) {
      float sum = c[static_cast<std::size_t>(col * 2 + row)];
      for (int p = 0; p < 4; ++p) {
        sum += a_values[static_cast<std::size_t>(row * 4 + p)] *
               b[static_cast<std::size_t>(col * 4 + p)];
      }
      reference[static_cast<std::size_t>(col * 2 + row)] = sum;
    }
  }
  CHECK((d == reference));
  // An epilogue is not modelled: refused, not ignored.
  const cublasLtEpilogue_t relu = CUBLASLT_EPILOGUE_RELU;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu, sizeof(relu));
  CHECK(cublasLtMatmul(handle, desc, &alpha, a.data(), la, b.data(), lb, &beta, d.data(), lc,
                       d.data(), lc, nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_NOT_SUPPORTED);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(handle);
}

TEST_CASE("emulated cuBLASLt: an algorithm needs the alignment its preference promised",
          "[emulation]") {
  // D (8 x 8) = A (8 x 8) B (8 x 8) in fp32, each matrix 16 bytes into a 256-byte aligned buffer.
  void* base = nullptr;
  REQUIRE(cudaMalloc(&base, 3 * 512) == cudaSuccess);
  auto* bytes = static_cast<unsigned char*>(base);
  auto* a = reinterpret_cast<float*>(bytes + 16);
  auto* b = reinterpret_cast<float*>(bytes + 512 + 16);
  auto* d = reinterpret_cast<float*>(bytes + 1024 + 16);
  std::fill(a, a + 64, 1.0F);
  std::fill(b, b + 64, 0.5F);
  cublasLtHandle_t handle = nullptr;
  REQUIRE(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t layout = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  const auto run_with = [&](cublasLtMatmulPreference_t preference) {
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    REQUIRE(cublasLtMatmulAlgoGetHeuristic(handle, desc, layout, layout, layout, layout, preference,
                                           1, &result, &found) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(found == 1);
    const float alpha = 1.0F, beta = 0.0F;
    return cublasLtMatmul(handle, desc, &alpha, a, layout, b, layout, &beta, d, layout, d, layout,
                          &result.algo, nullptr, 0, nullptr);
  };
  cublasLtMatmulPreference_t preference = nullptr;
  REQUIRE(cublasLtMatmulPreferenceCreate(&preference) == CUBLAS_STATUS_SUCCESS);
  // The default promise is 256 bytes: refused, as a real algorithm may fault.
  CHECK(run_with(preference) == CUBLAS_STATUS_INVALID_VALUE);
  const std::uint32_t sixteen = 16;
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES}) {
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &sixteen,
                                                 sizeof(sixteen)) == CUBLAS_STATUS_SUCCESS);
  }
  CHECK(run_with(preference) == CUBLAS_STATUS_INVALID_VALUE);  // D is still promised 256
  REQUIRE(cublasLtMatmulPreferenceSetAttribute(preference,
                                               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &sixteen,
                                               sizeof(sixteen)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(run_with(preference) == CUBLAS_STATUS_SUCCESS);
  finish();
  CHECK(std::all_of(d, d + 64, [](float v) { return v == 4.0F; }));
  // A leading dimension whose rows are not 32 bytes apart fails a 32-byte promise too.
  const std::uint32_t thirty_two = 32;
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &thirty_two,
                                                 sizeof(thirty_two)) == CUBLAS_STATUS_SUCCESS);
  }
  a = reinterpret_cast<float*>(bytes);  // 256-byte aligned pointers, 8 * 4 = 32-byte rows
  b = reinterpret_cast<float*>(bytes + 512);
  d = reinterpret_cast<float*>(bytes + 1024);
  CHECK(run_with(preference) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t narrow = nullptr;  // rows 9 floats (36 bytes) apart
  REQUIRE(cublasLtMatrixLayoutCreate(&narrow, CUDA_R_32F, 8, 8, 9) == CUBLAS_STATUS_SUCCESS);
  std::swap(layout, narrow);
  CHECK(run_with(preference) == CUBLAS_STATUS_INVALID_VALUE);
  finish();
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(layout);
  cublasLtMatrixLayoutDestroy(narrow);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(handle);
  REQUIRE(cudaFree(base) == cudaSuccess);
}

TEST_CASE("emulated device memory: NaN-filled, told apart from host memory", "[emulation]") {
  void* device = nullptr;
  REQUIRE(cudaMalloc(&device, 64) == cudaSuccess);
  CHECK(std::isnan(static_cast<float*>(device)[3]));
  cudaPointerAttributes attributes{};
  REQUIRE(cudaPointerGetAttributes(&attributes, static_cast<char*>(device) + 10) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeDevice);
  std::vector<float> host(4);
  REQUIRE(cudaPointerGetAttributes(&attributes, host.data()) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeUnregistered);
  CHECK(cudaFree(device) == cudaSuccess);
  CHECK(cudaFree(host.data()) == cudaErrorInvalidValue);  // not a device allocation
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("streams run their work only when needed: a missing event wait reads stale data",
          "[emulation]") {
  const std::size_t n = 16, bytes = n * sizeof(float);
  float* produced = nullptr;
  float* consumed = nullptr;
  float* pinned = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&produced), bytes) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&consumed), bytes) == cudaSuccess);
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), bytes, cudaHostAllocDefault) ==
          cudaSuccess);
  cudaStream_t producer = nullptr, consumer = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t ready = nullptr;
  REQUIRE(cudaEventCreate(&ready) == cudaSuccess);

  const bool random_progress = l3emu::set_random_progress(false);  // latest moment only
  std::fill(pinned, pinned + n, 1.0F);
  cudaMemcpyAsync(produced, pinned, bytes, cudaMemcpyHostToDevice, producer);
  cudaMemcpyAsync(consumed, produced, bytes, cudaMemcpyDeviceToDevice, consumer);  // no wait
  cudaStreamSynchronize(consumer);
  CHECK(std::isnan(consumed[0]));  // the producer's copy has not run

  cudaEventRecord(ready, producer);
  cudaStreamWaitEvent(consumer, ready, 0);
  cudaMemcpyAsync(consumed, produced, bytes, cudaMemcpyDeviceToDevice, consumer);
  cudaStreamSynchronize(consumer);
  CHECK(consumed[0] == 1.0F);  // the wait ran the producer first

  // A pinned source is read when the copy runs, not when it is queued.
  std::fill(pinned, pinned + n, 2.0F);
  cudaMemcpyAsync(produced, pinned, bytes, cudaMemcpyHostToDevice, producer);
  std::fill(pinned, pinned + n, 3.0F);
  cudaStreamSynchronize(producer);
  CHECK(produced[0] == 3.0F);
  // A pageable source is read before cudaMemcpyAsync returns.
  std::vector<float> pageable(n, 4.0F);
  cudaMemcpyAsync(produced, pageable.data(), bytes, cudaMemcpyHostToDevice, producer);
  std::fill(pageable.begin(), pageable.end(), 5.0F);
  cudaStreamSynchronize(producer);
  CHECK(produced[0] == 4.0F);

  l3emu::set_random_progress(random_progress);
  cudaEventDestroy(ready);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
  cudaFreeHost(pinned);
  cudaFree(consumed);
  cudaFree(produced);
}

namespace {
// y[i] = 2 x[i] + 1 over n elements, launched on `stream` as a translated kernel launch is.
void twice_plus_one(float* y, const float* x, int n, cudaStream_t stream) {
  l3emu::launch(l3emu::config(dim3((n + 63) / 64), dim3(64), 0, stream),
                [](float* out, const float* in, int count) {
                  const auto i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
                  if (i < count) out[i] = 2.0F * in[i] + 1.0F;
                })(y, x, n);
}
}  // namespace

TEST_CASE("a captured graph records its stream's work and replays it on current contents",
          "[emulation]") {
  const int n = 100;
  const std::size_t bytes = n * sizeof(float);
  float* input = nullptr;
  float* output = nullptr;
  float* pinned = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&input), bytes) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&output), bytes) == cudaSuccess);
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), bytes, cudaHostAllocDefault) ==
          cudaSuccess);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);

  cudaStreamCaptureStatus status{};
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  REQUIRE(cudaStreamIsCapturing(stream, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  // upload (pinned -> device), a kernel, a memset of the last element: recorded, not run
  REQUIRE(cudaMemcpyAsync(input, pinned, bytes, cudaMemcpyHostToDevice, stream) == cudaSuccess);
  twice_plus_one(output, input, n, stream);
  REQUIRE(cudaMemsetAsync(output + n - 1, 0, sizeof(float), stream) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);
  REQUIRE(cudaStreamIsCapturing(stream, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusNone);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(std::isnan(output[0]));  // nothing ran during the capture

  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);  // the exec keeps its own copy
  for (const float value : {1.0F, 5.0F, -2.0F}) {
    // Each replay reads the pinned buffer as it is when the replay runs.
    std::fill(pinned, pinned + n, value);
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(output[0] == 2.0F * value + 1.0F);
    CHECK(output[n - 2] == 2.0F * value + 1.0F);
    CHECK(output[n - 1] == 0.0F);
  }
  // A launch still queued when its exec is destroyed runs all the same.
  std::fill(pinned, pinned + n, 7.0F);
  const bool random_progress = l3emu::set_random_progress(false);
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(output[0] == 2.0F * -2.0F + 1.0F);  // not run yet
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(output[0] == 15.0F);
  l3emu::set_random_progress(random_progress);

  cudaStreamDestroy(stream);
  cudaFreeHost(pinned);
  cudaFree(output);
  cudaFree(input);
}

TEST_CASE("calls CUDA refuses during a capture fail and invalidate it", "[emulation]") {
  float* device = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&device), 64) == cudaSuccess);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  std::vector<float> pageable(16, 1.0F);
  const auto refused = [&](const auto& call, cudaError_t expected) {
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    twice_plus_one(device, device, 16, stream);  // fine on its own
    CHECK(call() == expected);
    cudaStreamCaptureStatus status{};
    REQUIRE(cudaStreamIsCapturing(stream, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(stream, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
  };
  void* more = nullptr;
  refused([&] { return cudaMalloc(&more, 64); }, cudaErrorStreamCaptureUnsupported);
  refused([&] { return cudaFree(device); }, cudaErrorStreamCaptureUnsupported);
  refused([&] { return cudaStreamSynchronize(stream); }, cudaErrorStreamCaptureUnsupported);
  refused([&] { return cudaDeviceSynchronize(); }, cudaErrorStreamCaptureUnsupported);
  refused(
      [&] { return cudaMemcpyAsync(device, pageable.data(), 64, cudaMemcpyHostToDevice, stream); },
      cudaErrorStreamCaptureUnsupported);
  refused(
      [&] { return cudaMemcpyAsync(pageable.data(), device, 64, cudaMemcpyDeviceToHost, stream); },
      cudaErrorStreamCaptureUnsupported);
  cudaEvent_t event = nullptr;
  REQUIRE(cudaEventCreate(&event) == cudaSuccess);
  refused([&] { return cudaEventRecord(event, stream); }, cudaErrorStreamCaptureUnsupported);
  refused([&] { return cudaStreamWaitEvent(stream, event, 0); }, cudaErrorStreamCaptureIsolation);
  CHECK(more == nullptr);
  // The legacy stream cannot capture; a stream cannot capture twice.
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeThreadLocal) ==
        cudaErrorStreamCaptureImplicit);
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaErrorIllegalState);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);  // still valid
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  cudaGetLastError();
  // Afterwards the same calls work again.
  REQUIRE(cudaMalloc(&more, 64) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  cudaFree(more);
  cudaEventDestroy(event);
  cudaStreamDestroy(stream);
  cudaFree(device);
}
