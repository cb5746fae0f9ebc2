// Embedding lookup and its deterministic gradient: positions are stably sorted by token, so
// the rows of one token are summed in a fixed order, in fp32, and added once.
#include <cub/cub.cuh>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/scratch_sizes.hpp"

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

// The gradient: positions are stably sorted by token (keys, with their positions in `order`),
// then cut into segments of kSegment sorted positions. Each segment sums the rows of each run of
// equal tokens it holds in position order; a run wholly inside a segment is added to its table
// row at once, and a run crossing segments leaves partial sums: its piece in the first segment
// it touches ("tail") and in each later one ("head"), which a second kernel adds up in segment
// order. Every sum has a fixed order (deterministic), and no run is summed by one thread row
// after row: a token repeated at thousands of positions (a padding id, a chat template's header
// tokens) is summed by as many blocks as it has segments, not by one.
constexpr int kSegment = static_cast<int>(kEmbeddingSegment);
constexpr int kSegmentThreads = 128;
constexpr int kUnroll = 4;  // rows loaded before they are added: loads in flight per thread

__device__ __forceinline__ void load_row(float (&v)[8], const bf16* p) {
  const Bf16x8 x = *reinterpret_cast<const Bf16x8*>(p);
#pragma unroll
  for (int w = 0; w < 8; ++w) v[w] = to_float(x.v[w]);
}
__device__ __forceinline__ void load_row(float (&v)[1], const bf16* p) { v[0] = to_float(*p); }

// Grid (segments, column groups / kSegmentThreads); W columns per thread (8: 16-byte loads,
// hidden % 8 == 0 and dout 16-byte aligned; else 1). head and tail: (segments, hidden) fp32.
template <int W, typename Grad>  // Grad: bf16 or float
__global__ void embedding_backward_segments_kernel(Grad* dtable, float* head, float* tail,
                                                   const std::int32_t* keys,
                                                   const std::int32_t* order, const bf16* dout,
                                                   std::int64_t n, std::int64_t hidden) {
  __shared__ std::int32_t seg_keys[kSegment];
  __shared__ std::int32_t seg_rows[kSegment];
  const std::int64_t segment = blockIdx.x;
  const std::int64_t begin = segment * kSegment;
  const int len = static_cast<int>(n - begin < kSegment ? n - begin : kSegment);
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    seg_keys[i] = keys[begin + i];
    seg_rows[i] = order[begin + i];
  }
  __syncthreads();
  // The segment's first run started in an earlier segment; its last goes on into the next.
  const bool first_from_before = begin > 0 && keys[begin - 1] == seg_keys[0];
  const bool last_goes_on = begin + len < n && keys[begin + len] == seg_keys[len - 1];
  const std::int64_t col = (static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * W;
  if (col >= hidden) return;  // (no barrier below)
  float acc[W];
#pragma unroll
  for (int w = 0; w < W; ++w) acc[w] = 0.0F;
  bool first_piece = true;
  for (int i = 0; i < len; i += kUnroll) {
    float rows[kUnroll][W] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u < len)
        load_row(rows[u], dout + static_cast<std::int64_t>(seg_rows[i + u]) * hidden + col);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int p = i + u;
      if (p >= len) break;
#pragma unroll
      for (int w = 0; w < W; ++w) acc[w] += rows[u][w];
      if (p + 1 < len && seg_keys[p + 1] == seg_keys[p]) continue;  // the run goes on here
      // A run's piece ends at p: to the partial sums, or (wholly inside) into its table row.
      float* partial = nullptr;
      if (first_piece && first_from_before) {
        partial = head + segment * hidden;
      } else if (p + 1 == len && last_goes_on) {
        partial = tail + segment * hidden;
      }
      if (partial != nullptr) {
#pragma unroll
        for (int w = 0; w < W; ++w) partial[col + w] = acc[w];
      } else {
        Grad* row = dtable + static_cast<std::int64_t>(seg_keys[p]) * hidden + col;
#pragma unroll
        for (int w = 0; w < W; ++w) add_to(row[w], acc[w]);
      }
#pragma unroll
      for (int w = 0; w < W; ++w) acc[w] = 0.0F;
      first_piece = false;
    }
  }
}

// Grid (segments, hidden / blockDim.x): the segment where a crossing run starts adds up its
// tail and the heads of the segments it goes on into, in order, into the run's table row.
template <typename Grad>
__global__ void embedding_backward_crossing_kernel(Grad* dtable, const float* head,
                                                   const float* tail, const std::int32_t* keys,
                                                   std::int64_t n, std::int64_t hidden) {
  const std::int64_t segment = blockIdx.x;
  const std::int64_t begin = segment * kSegment;
  const std::int64_t end = n - begin < kSegment ? n : begin + kSegment;
  const std::int32_t token = keys[end - 1];
  if (end == n || keys[end] != token) return;         // the last run ends here
  if (begin > 0 && keys[begin - 1] == token) return;  // it started earlier: not its first segment
  // Where the run ends: the first position after `end` with a larger key (keys are sorted).
  std::int64_t lo = end;
  std::int64_t hi = n;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] == token) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const std::int64_t last_segment = (lo - 1) / kSegment;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  float sum = tail[segment * hidden + c];
#pragma unroll 8
  for (std::int64_t s = segment + 1; s <= last_segment; ++s) sum += head[s * hidden + c];
  add_to(dtable[static_cast<std::int64_t>(token) * hidden + c], sum);
}

// Workspace layout: keys_out, order_in, order_out (n int32 each), head and tail ((segments,
// hidden) fp32 each), as scratch_sizes.hpp counts them for the memory plan, then cub's temporary
// storage.
struct BackwardWorkspace {
  std::int32_t* keys_out;
  std::int32_t* order_in;
  std::int32_t* order_out;
  float* head;
  float* tail;
  void* cub;
  std::size_t cub_bytes;
};

std::size_t cub_bytes(std::int64_t n) {
  std::size_t sort = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const std::int32_t*>(nullptr),
                                  static_cast<std::int32_t*>(nullptr),
                                  static_cast<const std::int32_t*>(nullptr),
                                  static_cast<std::int32_t*>(nullptr), static_cast<int>(n));
  return sort;
}

BackwardWorkspace carve(void* base, std::int64_t n, std::int64_t hidden, std::size_t bytes) {
  auto* p = static_cast<std::int32_t*>(base);
  BackwardWorkspace w{};
  w.keys_out = p;
  w.order_in = p + n;
  w.order_out = p + 2 * n;
  char* next = static_cast<char*>(base) + embedding_backward_ints_bytes(n);
  w.head = reinterpret_cast<float*>(next);
  w.tail = reinterpret_cast<float*>(next + embedding_backward_partial_bytes(n, hidden));
  const std::size_t used = embedding_backward_own_bytes(n, hidden);
  w.cub = static_cast<char*>(base) + used;
  w.cub_bytes = bytes - used;
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

std::size_t embedding_backward_workspace(std::int64_t n, std::int64_t hidden) {
  return embedding_backward_own_bytes(n, hidden) + cub_bytes(n);
}

namespace {

template <typename Grad>
void embedding_backward_into(Grad* dtable, const std::int32_t* tokens, const BFloat16* dout,
                             std::int64_t n, std::int64_t hidden, void* workspace,
                             std::size_t workspace_bytes, cudaStream_t stream) {
  if (n == 0 || hidden == 0) return;
  const BackwardWorkspace w = carve(workspace, n, hidden, workspace_bytes);
  iota_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(w.order_in, n);
  check_launch("embedding backward: positions");
  std::size_t bytes = w.cub_bytes;
  // LSD radix sort is stable: equal tokens keep their position order.
  check(cub::DeviceRadixSort::SortPairs(w.cub, bytes, tokens, w.keys_out, w.order_in, w.order_out,
                                        static_cast<int>(n), 0, 32, stream),
        "embedding backward: sort tokens");
  const auto segments = static_cast<unsigned int>(embedding_segments(n));
  const bf16* d = device_cast(dout);
  if (hidden % 8 == 0 && aligned16(dout)) {
    const dim3 grid(segments, blocks_for(hidden / 8, kSegmentThreads));
    embedding_backward_segments_kernel<8><<<grid, kSegmentThreads, 0, stream>>>(
        device_cast(dtable), w.head, w.tail, w.keys_out, w.order_out, d, n, hidden);
  } else {
    const dim3 grid(segments, blocks_for(hidden, kSegmentThreads));
    embedding_backward_segments_kernel<1><<<grid, kSegmentThreads, 0, stream>>>(
        device_cast(dtable), w.head, w.tail, w.keys_out, w.order_out, d, n, hidden);
  }
  check_launch("embedding backward: segments");
  const dim3 grid(segments, blocks_for(hidden, kThreads));
  embedding_backward_crossing_kernel<<<grid, kThreads, 0, stream>>>(device_cast(dtable), w.head,
                                                                    w.tail, w.keys_out, n, hidden);
  check_launch("embedding backward: runs across segments");
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
