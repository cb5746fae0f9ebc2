// Small layout kernels around the cuDNN fused attention (kernels/cuda/cudnn_attention.cpp):
// the per-batch tables cuDNN's packed ("ragged", THD) layout reads, computed on the device from
// cu_seqlens so that no host round trip is needed, and the transposes between cuDNN's softmax
// statistics (token-major, (N, heads)) and the backend's lse layout (head-major, (heads, N)).
#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda::detail {

namespace {

constexpr int kTableThreads = 128;
constexpr int kTile = 32;     // transpose tile edge
constexpr int kTileRows = 8;  // rows of a tile handled per thread-row pass
constexpr int kMaxGridY = 65535;

// One thread per batch entry b in [0, batch]. Entries past the real segments are empty (length
// 0) and start at the end of the packed tokens, so a plan built for `batch` entries serves any
// packing with at most `batch` segments.
__global__ void sdpa_tables_kernel(const std::int32_t* cu_seqlens, int segments, int batch,
                                   std::int64_t q_per_token, std::int64_t kv_per_token,
                                   std::int64_t stats_per_token, std::int32_t* seq_len,
                                   std::int64_t* q_offset, std::int64_t* kv_offset,
                                   std::int64_t* stats_offset) {
  const int b = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (b > batch) return;
  const std::int64_t start = cu_seqlens[b < segments ? b : segments];
  if (b < batch) {
    const std::int64_t end = cu_seqlens[b + 1 < segments ? b + 1 : segments];
    seq_len[b] = static_cast<std::int32_t>(end - start);
  }
  q_offset[b] = start * q_per_token;
  kv_offset[b] = start * kv_per_token;
  stats_offset[b] = start * stats_per_token;
}

// out (cols x rows) = transpose of in (rows x cols), both row-major fp32, through a shared
// tile so that reads and writes are both coalesced.
__global__ void transpose_kernel(float* out, const float* in, std::int64_t rows,
                                 std::int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];  // +1: no bank conflicts on the transposed read
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  for (std::int64_t row0 = static_cast<std::int64_t>(blockIdx.y) * kTile; row0 < rows;
       row0 += static_cast<std::int64_t>(gridDim.y) * kTile) {
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const std::int64_t row = row0 + r;
      const std::int64_t col = col0 + threadIdx.x;
      if (row < rows && col < cols) tile[r][threadIdx.x] = in[row * cols + col];
    }
    __syncthreads();
    for (int c = threadIdx.y; c < kTile; c += kTileRows) {
      const std::int64_t col = col0 + c;
      const std::int64_t row = row0 + threadIdx.x;
      if (row < rows && col < cols) out[col * rows + row] = tile[threadIdx.x][c];
    }
    __syncthreads();
  }
}

}  // namespace

void sdpa_tables(const std::int32_t* cu_seqlens, int segments, int batch, std::int64_t q_per_token,
                 std::int64_t kv_per_token, std::int64_t stats_per_token, std::int32_t* seq_len,
                 std::int64_t* q_offset, std::int64_t* kv_offset, std::int64_t* stats_offset,
                 cudaStream_t stream) {
  sdpa_tables_kernel<<<blocks_for(static_cast<std::int64_t>(batch) + 1, kTableThreads),
                       kTableThreads, 0, stream>>>(cu_seqlens, segments, batch, q_per_token,
                                                   kv_per_token, stats_per_token, seq_len, q_offset,
                                                   kv_offset, stats_offset);
  check_launch("cuDNN attention: segment tables");
}

void transpose_f32(float* out, const float* in, std::int64_t rows, std::int64_t cols,
                   cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const auto tiles_y =
      static_cast<unsigned int>(std::min<std::int64_t>((rows + kTile - 1) / kTile, kMaxGridY));
  const dim3 grid(blocks_for(cols, kTile), tiles_y);
  const dim3 block(kTile, kTileRows);
  transpose_kernel<<<grid, block, 0, stream>>>(out, in, rows, cols);
  check_launch("cuDNN attention: statistics transpose");
}

}  // namespace l3::cuda::detail
