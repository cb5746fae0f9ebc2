// Embedding lookup and its deterministic gradient: positions are stably sorted by token, so
// the rows of one token are summed in position order, in fp32, and added once.
#include <cub/cub.cuh>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

// One block per token row.
// vectorized: hidden % 8 == 0 and out, table 16-byte aligned (checked on the host), so that every
// row of both starts on a 16-byte boundary.
__global__ void embedding_forward_kernel(bf16* out, const std::int32_t* tokens, const bf16* table,
                                         std::int64_t hidden, std::int64_t vocab, bool vectorized) {
  const std::int64_t t = blockIdx.x;
  const std::int32_t token = tokens[t];
  bf16* dst = out + t * hidden;
  if (token < 0 || token >= vocab) {  // validated on the host; never read out of bounds
    for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = to_bf16(0.0F);
    return;
  }
  const bf16* src = table + static_cast<std::int64_t>(token) * hidden;
  if (vectorized) {
    const auto* src8 = reinterpret_cast<const Bf16x8*>(src);
    auto* dst8 = reinterpret_cast<Bf16x8*>(dst);
    for (std::int64_t i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst8[i] = src8[i];
  } else {
    for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void iota_kernel(std::int32_t* out, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = static_cast<std::int32_t>(i);
}

// One block per possible run; run r covers sorted positions [offsets[r], offsets[r+1]) (the last
// run ends at n). Blocks past the number of runs (known only on the device) exit: no host sync.
template <typename Grad>  // bf16 or float
__global__ void embedding_backward_kernel(Grad* dtable, const std::int32_t* run_tokens,
                                          const std::int32_t* run_offsets,
                                          const std::int32_t* run_count, const std::int32_t* order,
                                          const bf16* dout, std::int64_t n, std::int64_t hidden) {
  const int run = blockIdx.x;
  const int runs = *run_count;
  if (run >= runs) return;
  const std::int32_t token = run_tokens[run];
  const std::int32_t begin = run_offsets[run];
  const std::int32_t end = run + 1 < runs ? run_offsets[run + 1] : static_cast<std::int32_t>(n);
  for (std::int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float sum = 0.0F;
    for (std::int32_t p = begin; p < end; ++p) sum += to_float(dout[order[p] * hidden + c]);
    add_to(dtable[static_cast<std::int64_t>(token) * hidden + c], sum);
  }
}

// Workspace layout (all int32 unless noted): keys_out, order_in, order_out, run_tokens,
// run_counts, run_offsets (n + 1), run_count (1), then cub's temporary storage.
struct BackwardWorkspace {
  std::int32_t* keys_out;
  std::int32_t* order_in;
  std::int32_t* order_out;
  std::int32_t* run_tokens;
  std::int32_t* run_counts;
  std::int32_t* run_offsets;
  std::int32_t* run_count;
  void* cub;
  std::size_t cub_bytes;
};

std::size_t cub_bytes(std::int64_t n) {
  std::size_t sort = 0;
  std::size_t encode = 0;
  std::size_t scan = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const std::int32_t*>(nullptr),
                                  static_cast<std::int32_t*>(nullptr),
                                  static_cast<const std::int32_t*>(nullptr),
                                  static_cast<std::int32_t*>(nullptr), static_cast<int>(n));
  cub::DeviceRunLengthEncode::Encode(nullptr, encode, static_cast<const std::int32_t*>(nullptr),
                                     static_cast<std::int32_t*>(nullptr),
                                     static_cast<std::int32_t*>(nullptr),
                                     static_cast<std::int32_t*>(nullptr), static_cast<int>(n));
  cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const std::int32_t*>(nullptr),
                                static_cast<std::int32_t*>(nullptr), static_cast<int>(n) + 1);
  return std::max(sort, std::max(encode, scan));
}

BackwardWorkspace carve(void* base, std::int64_t n, std::size_t bytes) {
  auto* p = static_cast<std::int32_t*>(base);
  BackwardWorkspace w{};
  w.keys_out = p;
  w.order_in = p + n;
  w.order_out = p + 2 * n;
  w.run_tokens = p + 3 * n;
  w.run_counts = p + 4 * n;
  w.run_offsets = p + 5 * n;  // n + 1
  w.run_count = p + 6 * n + 1;
  const std::size_t used = (6 * static_cast<std::size_t>(n) + 2) * sizeof(std::int32_t);
  const std::size_t aligned = (used + 255) / 256 * 256;
  w.cub = static_cast<char*>(base) + aligned;
  w.cub_bytes = bytes - aligned;
  return w;
}

}  // namespace

void embedding_forward(BFloat16* out, const std::int32_t* tokens, const BFloat16* table,
                       std::int64_t n, std::int64_t hidden, std::int64_t vocab,
                       cudaStream_t stream) {
  if (n == 0) return;
  embedding_forward_kernel<<<static_cast<unsigned int>(n), kThreads, 0, stream>>>(
      device_cast(out), tokens, device_cast(table), hidden, vocab,
      hidden % 8 == 0 && aligned16(out, table));
  check_launch("embedding forward");
}

std::size_t embedding_backward_workspace(std::int64_t n) {
  const std::size_t ints = (6 * static_cast<std::size_t>(n) + 2) * sizeof(std::int32_t);
  return (ints + 255) / 256 * 256 + cub_bytes(n);
}

namespace {

template <typename Grad>
void embedding_backward_into(Grad* dtable, const std::int32_t* tokens, const BFloat16* dout,
                             std::int64_t n, std::int64_t hidden, void* workspace,
                             std::size_t workspace_bytes, cudaStream_t stream) {
  if (n == 0) return;
  const BackwardWorkspace w = carve(workspace, n, workspace_bytes);
  const int count = static_cast<int>(n);
  iota_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(w.order_in, n);
  check_launch("embedding backward: positions");
  std::size_t bytes = w.cub_bytes;
  // LSD radix sort is stable: equal tokens keep their position order.
  check(cub::DeviceRadixSort::SortPairs(w.cub, bytes, tokens, w.keys_out, w.order_in, w.order_out,
                                        count, 0, 32, stream),
        "embedding backward: sort tokens");
  bytes = w.cub_bytes;
  check(cub::DeviceRunLengthEncode::Encode(w.cub, bytes, w.keys_out, w.run_tokens, w.run_counts,
                                           w.run_count, count, stream),
        "embedding backward: runs");
  bytes = w.cub_bytes;
  // Exclusive sum over all n slots: the entries of real runs are right, the rest unused.
  check(cub::DeviceScan::ExclusiveSum(w.cub, bytes, w.run_counts, w.run_offsets, count, stream),
        "embedding backward: offsets");
  embedding_backward_kernel<<<static_cast<unsigned int>(n), kThreads, 0, stream>>>(
      device_cast(dtable), w.run_tokens, w.run_offsets, w.run_count, w.order_out, device_cast(dout),
      n, hidden);
  check_launch("embedding backward");
}

}  // namespace

void embedding_backward(BFloat16* dtable, const std::int32_t* tokens, const BFloat16* dout,
                        std::int64_t n, std::int64_t hidden, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t stream) {
  embedding_backward_into(dtable, tokens, dout, n, hidden, workspace, workspace_bytes, stream);
}
void embedding_backward(float* dtable, const std::int32_t* tokens, const BFloat16* dout,
                        std::int64_t n, std::int64_t hidden, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t stream) {
  embedding_backward_into(dtable, tokens, dout, n, hidden, workspace, workspace_bytes, stream);
}

}  // namespace l3::cuda
