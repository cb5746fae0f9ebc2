// Causal GQA attention over packed segments on cuDNN 9's fused flash-attention engines, built
// with the backend graph API (no cudnn-frontend): forward (out, lse) and backward (dq, dk, dv)
// with the same arguments and results as CudaOps::attention / attention_backward.
//
// How CudaOps calls it
// --------------------
//   * Keep one CudnnAttention per CudaOps (it owns a cuDNN handle, the cached execution plans and
//     one grow-only device buffer); construction touches no device state, the handle is created
//     by the first call.
//   * attention(args): shape = kernels::attention_shape(args) (the checked sizes of the views),
//       if (!cudnn_.forward(args, shape, stream_)) fallback...
//     attention_backward(args) likewise with cudnn_.backward(args, shape, stream_).
//     args.segments.host is an optional host copy of cu_seqlens (empty span: none); when given
//     it is validated (starts at 0, never decreases, ends at N, longest segment <=
//     shape.max_segment) and no host-device copy is needed either way: the per-segment tables
//     are computed on the device from args.segments.cu_seqlens. Without it, shape.n_segments
//     must be exact and shape.max_segment at least the longest segment (as the fallback already
//     requires).
//   * Buffers: exactly the ones of kernels/ops.hpp. q, out, dq, dout (N, n_heads, head_dim) bf16;
//     k, v, dk, dv (N, n_kv_heads, head_dim) bf16 (never replicated); lse (n_heads, N) f32;
//     cu_seqlens (n_segments + 1) i32 on the device. dq, dk, dv are overwritten.
//   * lse contract: forward() leaves in `lse` the natural-log log-sum-exp of each query's scaled
//     scores, (n_heads, N), the same values the fallback writes; backward() reads its softmax
//     statistics from that `lse` buffer only (nothing is kept between calls), so a forward by
//     either path pairs with a backward by either path, recomputation included.
//   * Returns false, having queued nothing and written nothing, when cuDNN cannot run the case;
//     last_unsupported_reason() then says why. That happens for: dtypes other than bf16 (f32
//     lse, i32 cu_seqlens), head_dim not a multiple of 16 or above 128, n_heads not a multiple
//     of n_kv_heads, pointers not 16-byte aligned, a GPU other than sm_90/sm_100, a cuDNN runtime
//     older than 9.10.2, a graph no cuDNN engine accepts, or a plan needing more workspace than
//     CudnnAttentionOptions::max_plan_workspace_bytes. A refused shape bucket is remembered, so
//     asking again is cheap. It throws (core internal error) for inconsistent inputs (views
//     smaller than the shape, a bad host cu_seqlens) and for CUDA/cuDNN failures while running.
//   * All calls of one instance must be ordered on one stream (a change of stream synchronises
//     the previous one): the device buffer is reused by every call.
//
// Checking without a GPU: compile_offline() builds the plans for a GPU described by cuDNN's
// device-properties JSON. On a machine with no driver, put a libcuda.so.1 on LD_LIBRARY_PATH
// that links to the toolkit's stub (/usr/local/cuda/lib64/stubs/libcuda.so): cuDNN's runtime-
// compiled engines then check and compile the graph for that GPU and stop at loading the
// module, which compile_offline() reports as "compiled; not loaded". cuDNN 9.19 accepts both
// graphs for sm_90 this way (engines 2 forward, 6 backward) for every head layout tested.
//
// How the work maps onto cuDNN (see cudnn_attention.cpp)
// ------------------------------------------------------
// Segments are cuDNN batches in the packed "THD" layout: dims (B, H, S, D) with token stride
// H * D, per-batch ragged offsets cu_seqlens[b] * H * D, and per-batch sequence lengths
// (padding mask); the causal mask is top-left aligned within each batch, so no token sees
// another segment. B and S are rounded up to powers of two (unused batches are empty), so one
// plan serves every packing in its bucket.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kernels/cuda/cudnn_attention_sizes.hpp"
#include "kernels/ops.hpp"

namespace l3::cuda {

struct CudnnAttentionOptions {
  // false: cuDNN's fastest backward, whose dq accumulation order (fp32 atomics) differs from
  // run to run (--attention cudnn-nondeterministic). true: the backward that stores dP in the
  // workspace instead (bitwise reproducible, workspace about B * n_heads * S^2 * 2 bytes for the
  // bucket B x S: cudnn_attention_sizes.hpp); what --attention auto and cudnn use.
  bool deterministic = false;
  // Plans whose cuDNN workspace exceeds this are refused (the call returns false).
  std::size_t max_plan_workspace_bytes = kCudnnMaxPlanWorkspaceBytes;
};

// Why cuDNN attention cannot run at all with cuDNN runtime `cudnn_version` (cudnnGetVersion())
// on a GPU of compute capability cc_major.cc_minor; empty when it can (shapes aside). Pure: the
// backend's --attention choice (kernels::choose_attention) and its tests ask it too.
[[nodiscard]] std::string cudnn_attention_unavailable(std::size_t cudnn_version, int cc_major,
                                                      int cc_minor);
// Why its deterministic backward cannot run on such a GPU; empty when it can.
[[nodiscard]] std::string cudnn_deterministic_backward_unavailable(int cc_major, int cc_minor);

class CudnnAttention {
 public:
  explicit CudnnAttention(CudnnAttentionOptions options = {});
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;
  CudnnAttention(CudnnAttention&&) = delete;
  CudnnAttention& operator=(CudnnAttention&&) = delete;

  // a.out, a.lse from a.q, a.k, a.v (see the top of this file), with `shape` the sizes
  // kernels::attention_shape derived from `a`; queued on `stream`.
  [[nodiscard]] bool forward(const kernels::AttentionArgs& a, const kernels::AttentionShape& shape,
                             cudaStream_t stream);
  // a.dq, a.dk, a.dv (overwritten) from a.dout and the forward's a.out and a.lse; queued on
  // `stream`.
  [[nodiscard]] bool backward(const kernels::AttentionBackwardArgs& a,
                              const kernels::AttentionShape& shape, cudaStream_t stream);

  // Device-less check, for CI on machines without a GPU: builds, then discards, the forward and
  // backward plans of `shape`'s bucket for the GPU that `device_properties_json` describes (the
  // CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION of cudnn_graph.h, i.e. what cuDNN serialises from
  // a real device; cuDNN >= 9.11 compiles against it without a GPU). Returns an empty string
  // when both plans build, else why not; `plans` (optional) receives a line per plan. It shows
  // that cuDNN accepts the graphs and has fused engines for them, not that the numbers are right.
  [[nodiscard]] static std::string compile_offline(std::string_view device_properties_json,
                                                   const kernels::AttentionShape& shape,
                                                   CudnnAttentionOptions options = {},
                                                   std::string* plans = nullptr);

  // Why the last forward/backward returned false (empty after a call that ran).
  [[nodiscard]] std::string last_unsupported_reason() const;
  // Execution plans built so far (forward and backward, all buckets); for tests and logs.
  [[nodiscard]] std::size_t plan_count() const;
  // The device buffer's size now (our scratch and cuDNN's workspace of the largest call so far,
  // grown in steps) and the largest cuDNN workspace of the plans built; for benchmarks.
  [[nodiscard]] std::size_t buffer_bytes() const;
  [[nodiscard]] std::int64_t largest_plan_workspace() const;
  // A line per built plan: bucket, engine, workspace; for logs.
  [[nodiscard]] std::string describe_plans() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

namespace detail {

// cudnn_attention_layout.cu (asynchronous on `stream`). For b in [0, batch]: with
// start = cu_seqlens[min(b, segments)], q_offset[b] = start * q_per_token, kv_offset[b] =
// start * kv_per_token, stats_offset[b] = start * stats_per_token, and for b < batch
// seq_len[b] = cu_seqlens[min(b + 1, segments)] - start (0 for the unused batches).
void sdpa_tables(const std::int32_t* cu_seqlens, int segments, int batch, std::int64_t q_per_token,
                 std::int64_t kv_per_token, std::int64_t stats_per_token, std::int32_t* seq_len,
                 std::int64_t* q_offset, std::int64_t* kv_offset, std::int64_t* stats_offset,
                 cudaStream_t stream);
// out (cols, rows) = transpose of in (rows, cols), fp32 row-major.
void transpose_f32(float* out, const float* in, std::int64_t rows, std::int64_t cols,
                   cudaStream_t stream);

}  // namespace detail

}  // namespace l3::cuda
