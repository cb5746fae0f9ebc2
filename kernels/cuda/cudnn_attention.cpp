// cuDNN 9 fused flash attention through the backend graph API (the contract is in
// cudnn_attention.hpp).
//
// Why an operation graph and not CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR: in cuDNN 9.19
// those dedicated operations have no causal (diagonal band) attribute (cudnn_graph_v9.h lists
// Q/K/V/O/stats/scale/block mask/page tables/sequence lengths only, and cudnn-frontend uses its
// "unified" SDPA node only from 9.21 when a diagonal band is asked for). So we build the graph
// that cudnn-frontend's composite SDPA nodes lower to for 9.19, operation by operation; cuDNN's
// heuristics recognise the pattern and return its fused flash-attention engines:
//
//   forward   S = Q K^T (fp32) -> * scale -> padding mask -> causal mask -> softmax, whose
//             statistics max + log(sum exp) are written out -> P (bf16) -> O = P V
//   backward  D = rowsum(dO * O); S as above, P = exp(S - stats); dV = P^T dO;
//             dS = P * (dO V^T - D) * scale; dK = dS^T Q; dQ = dS K (fp32 accumulator, or
//             straight to bf16 in the deterministic variant)
//
// Tensors are 4-d (batch, heads, sequence, head_dim) with the batch = one packed segment. The
// token-major packed layout of the backend ("THD") is expressed as strides (S*H*D, D, H*D, 1)
// plus a ragged-offset tensor per batch (cu_seqlens[b] * H * D elements); the padding mask
// with per-batch sequence lengths keeps every batch to its own tokens, and the top-left causal
// mask (row >= column within a batch) makes each segment causal. GQA is the plain head
// broadcast of K/V (n_heads a multiple of n_kv_heads) in the matmuls and a head-group
// reduction for dK/dV, as cuDNN's SDPA pattern expects; K/V are never replicated.
//
// Softmax statistics: cuDNN writes/reads them per token (dims (B, n_heads, S, 1), strides
// (S*H, 1, H, 1), ragged like Q), i.e. (N, n_heads) token-major in our scratch; the lse of the
// interface is (n_heads, N), so forward transposes them out and backward transposes lse in.
#include "kernels/cuda/cudnn_attention.hpp"

#include <cudnn.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "kernels/cuda/carver.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cudnn_attention_sizes.hpp"

namespace l3::cuda {

using kernels::AttentionShape;
using kernels::ConstTensorView;
using kernels::DType;

namespace {

// ---- limits of what this component sends to cuDNN --------------------------------------------

// cudnn-frontend's packed-layout SDPA tests start at 9.10 and it refuses 9.10.0/9.10.1 (bugs)
constexpr std::size_t kMinRuntimeVersion = 91002;
constexpr std::int64_t kMinSeqBucket = kCudnnMinSeqBucket;  // smallest S of a plan
constexpr std::int64_t kTokenMargin = kCudnnTokenMargin;    // spare tokens after our fp32 scratch
constexpr std::int64_t kAlignment = 16;                     // bytes; tensor-core engines need 16
constexpr int kMaxHeadDim = kCudnnMaxHeadDim;

// ---- errors ----------------------------------------------------------------------------------

std::string cudnn_detail() {
  std::array<char, 1024> text{};
  cudnnGetLastErrorString(text.data(), text.size());
  return {text.data()};
}

// check() with the operation/shape context and cuDNN's own explanation of the failure.
void checked(cudnnStatus_t status, const std::string& context, std::string_view step) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  const std::string detail = cudnn_detail();
  check(status, detail.empty() ? fmt::format("{}: {}", context, step)
                               : fmt::format("{}: {} [{}]", context, step, detail));
}

// A refusal by cuDNN (graph or engine not supported), as text for last_unsupported_reason().
std::string refusal(cudnnStatus_t status, std::string_view step) {
  const std::string detail = cudnn_detail();
  return fmt::format("{}: {}{}{}", step, cudnnGetErrorString(status), detail.empty() ? "" : " - ",
                     detail);
}

// ---- RAII ------------------------------------------------------------------------------------

struct DescriptorDeleter {
  void operator()(cudnnBackendDescriptor_t descriptor) const noexcept {
    cudnnBackendDestroyDescriptor(descriptor);  // nothing useful to do with a failure here
  }
};
using Descriptor =
    std::unique_ptr<std::remove_pointer_t<cudnnBackendDescriptor_t>, DescriptorDeleter>;

struct HandleDeleter {
  void operator()(cudnnHandle_t handle) const noexcept { cudnnDestroy(handle); }
};
using Handle = std::unique_ptr<std::remove_pointer_t<cudnnHandle_t>, HandleDeleter>;

struct DeviceFree {
  void operator()(void* pointer) const noexcept { cudaFree(pointer); }
};

Descriptor create(cudnnBackendDescriptorType_t type, const std::string& context,
                  std::string_view step) {
  cudnnBackendDescriptor_t raw = nullptr;
  checked(cudnnBackendCreateDescriptor(type, &raw), context, step);
  return Descriptor(raw);
}

void set(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
         cudnnBackendAttributeType_t type, std::int64_t count, const void* values,
         const std::string& context, std::string_view step) {
  checked(cudnnBackendSetAttribute(descriptor, name, type, count, values), context, step);
}

void set_descriptor(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                    cudnnBackendDescriptor_t value, const std::string& context,
                    std::string_view step) {
  set(descriptor, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, context, step);
}

// A grow-only device buffer shared by every call (cuDNN workspace and our scratch).
class DeviceBuffer {
 public:
  void* get(std::size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_) return data_.get();
    // Earlier calls queued on the stream may still use the old buffer.
    check(cudaStreamSynchronize(stream), "cuDNN attention: wait before growing the workspace");
    data_.reset();
    // at least a quarter more than before (packings vary from step to step), in 2 MiB pages
    constexpr std::size_t kPage = std::size_t{2} << 20U;
    const std::size_t grown = (std::max(bytes, bytes_ + bytes_ / 4) + kPage - 1) / kPage * kPage;
    bytes_ = 0;
    void* raw = nullptr;
    check(cudaMalloc(&raw, grown),
          fmt::format("cuDNN attention: cudaMalloc of {} bytes of workspace", grown));
    data_.reset(raw);
    bytes_ = grown;
    return raw;
  }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<void, DeviceFree> data_;
  std::size_t bytes_ = 0;
};

// ---- the operation graph -----------------------------------------------------------------------

using Dims = std::array<std::int64_t, 4>;

// Unique ids of the tensors the variant pack binds to memory; virtual ones count from 1000.
enum Uid : std::int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kSeqLenQ,
  kSeqLenKv,
  kOffsetQ,
  kOffsetK,
  kOffsetV,
  kOffsetO,
  kOffsetStats,
  kScale,
  kPaddingFill,
  kCausalFill,
  kDo,
  kDq,
  kDk,
  kDv,
  kOne,
  kRowDot,
  kDqAccum,
  kDkFull,
  kDvFull,
  kFirstVirtual = 1000,
};

// Descriptors of one operation graph, kept alive as long as its plan.
class GraphBuilder {
 public:
  explicit GraphBuilder(std::string context) : context_(std::move(context)) {}

  [[nodiscard]] const std::string& context() const { return context_; }
  [[nodiscard]] const std::vector<cudnnBackendDescriptor_t>& operations() const { return ops_; }

  cudnnBackendDescriptor_t tensor(std::int64_t uid, cudnnDataType_t type, const Dims& dims,
                                  const Dims& strides, bool is_virtual, bool by_value,
                                  cudnnBackendDescriptor_t ragged_offset, std::string_view name) {
    Descriptor t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, context_, name);
    set(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, context_, name);
    set(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), context_, name);
    set(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), context_, name);
    set(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, context_, name);
    set(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment, context_,
        name);
    const bool yes = true;
    if (is_virtual) {
      set(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, context_, name);
    }
    if (by_value) {
      set(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, context_, name);
    }
    if (ragged_offset != nullptr) {
      set_descriptor(t.get(), CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, ragged_offset, context_, name);
    }
    checked(cudnnBackendFinalize(t.get()), context_, name);
    return keep(std::move(t));
  }
  cudnnBackendDescriptor_t intermediate(cudnnDataType_t type, const Dims& dims, const Dims& strides,
                                        std::string_view name,
                                        cudnnBackendDescriptor_t ragged_offset = nullptr) {
    return tensor(next_uid_++, type, dims, strides, true, false, ragged_offset, name);
  }

  // y = mode(x[, b[, t]]) elementwise with broadcasting; `axis` for GEN_INDEX only.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 std::string_view name, std::int64_t axis = -1) {
    Descriptor desc = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, context_, name);
    set(desc.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, context_, name);
    set(desc.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math, context_, name);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) {
      set(desc.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, context_, name);
    }
    checked(cudnnBackendFinalize(desc.get()), context_, name);
    Descriptor op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc.get(), context_,
                   name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, context_, name);
    if (b != nullptr)
      set_descriptor(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, context_, name);
    if (t != nullptr)
      set_descriptor(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, context_, name);
    const float one = 1.0F;
    set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, context_, name);
    set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, context_, name);
    checked(cudnnBackendFinalize(op.get()), context_, name);
    keep(std::move(desc));
    ops_.push_back(keep(std::move(op)));
  }

  // c = a b (batched over dims 0, 1 with head broadcast), fp32 accumulation; the overrides are
  // per-batch actual M, N, K (sequence lengths) read from device tensors.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
              cudnnBackendDescriptor_t m_override, cudnnBackendDescriptor_t n_override,
              cudnnBackendDescriptor_t k_override, std::string_view name) {
    Descriptor desc = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, context_, name);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(desc.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, context_, name);
    checked(cudnnBackendFinalize(desc.get()), context_, name);
    Descriptor op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, desc.get(), context_, name);
    if (m_override != nullptr) {
      set_descriptor(op.get(), CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override,
                     context_, name);
    }
    if (n_override != nullptr) {
      set_descriptor(op.get(), CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_override,
                     context_, name);
    }
    if (k_override != nullptr) {
      set_descriptor(op.get(), CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_override,
                     context_, name);
    }
    checked(cudnnBackendFinalize(op.get()), context_, name);
    keep(std::move(desc));
    ops_.push_back(keep(std::move(op)));
  }

  // y = reduce(x) over the dimensions where y has extent 1 (or a head group, for dK/dV).
  void reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y, std::string_view name) {
    Descriptor desc = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, context_, name);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(desc.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, context_,
        name);
    set(desc.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce,
        context_, name);
#if CUDNN_VERSION >= 91100
    if (cudnnGetVersion() >= 91100) {  // attribute introduced in 9.11; cudnn-frontend sets false
      const bool deterministic = false;
      set(desc.get(), CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic,
          context_, name);
    }
#endif
    checked(cudnnBackendFinalize(desc.get()), context_, name);
    Descriptor op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc.get(), context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, context_, name);
    checked(cudnnBackendFinalize(op.get()), context_, name);
    keep(std::move(desc));
    ops_.push_back(keep(std::move(op)));
  }

  // y = x viewed with other dims/strides (a transpose of the last two dims here).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, std::string_view name) {
    Descriptor op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, context_, name);
    set_descriptor(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, context_, name);
    checked(cudnnBackendFinalize(op.get()), context_, name);
    ops_.push_back(keep(std::move(op)));
  }

 private:
  cudnnBackendDescriptor_t keep(Descriptor d) {
    owned_.push_back(std::move(d));
    return owned_.back().get();
  }

  std::string context_;
  std::vector<Descriptor> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::int64_t next_uid_ = kFirstVirtual;
};

// One cached plan per bucket: B = segments and S = longest segment, both rounded up.
struct PlanKey {
  bool backward = false;
  bool deterministic = false;  // backward only
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  auto operator<=>(const PlanKey&) const = default;  // NOLINT(modernize-use-nullptr): tidy 14 bug
};

std::string describe(const PlanKey& key) {
  return fmt::format(
      "cuDNN SDPA {}{} (batch bucket {}, sequence bucket {}, {} heads, {} kv heads, "
      "head_dim {})",
      key.backward ? "backward" : "forward",
      key.backward && key.deterministic ? " deterministic" : "", key.batch, key.seq, key.heads,
      key.kv_heads, key.head_dim);
}

// The extents of one bucket and the layouts built from them.
struct Layout {
  std::int64_t b, s, hq, hk, d;

  // Packed token-major (THD) activation with h heads: element (b, h, s, d) at
  // offset[b] + s * h_count * D + h * D + d.
  [[nodiscard]] Dims packed_dims(std::int64_t h) const { return {b, h, s, d}; }
  [[nodiscard]] Dims packed_strides(std::int64_t h) const { return {s * h * d, d, h * d, 1}; }
  // The same memory seen with the last two dims swapped (K^T, V^T).
  [[nodiscard]] Dims packed_t_dims(std::int64_t h) const { return {b, h, d, s}; }
  [[nodiscard]] Dims packed_t_strides(std::int64_t h) const { return {s * h * d, d, 1, h * d}; }
  // Softmax statistics per token and head, token-major like Q: (N, hq) in memory.
  [[nodiscard]] Dims stats_dims() const { return {b, hq, s, 1}; }
  [[nodiscard]] Dims stats_strides() const { return {s * hq, 1, hq, 1}; }
  // Virtual score matrices (B, hq, S, S) and per-row values (B, hq, S, 1).
  [[nodiscard]] Dims score_dims() const { return {b, hq, s, s}; }
  [[nodiscard]] Dims score_strides() const { return {hq * s * s, s * s, s, 1}; }
  [[nodiscard]] Dims score_t_strides() const { return {hq * s * s, s * s, 1, s}; }
  [[nodiscard]] Dims row_dims() const { return {b, hq, s, 1}; }
  [[nodiscard]] Dims row_strides() const { return {hq * s, s, 1, 1}; }
};

constexpr Dims kScalar = {1, 1, 1, 1};

// The tensors both graphs bind to memory.
struct Bound {
  cudnnBackendDescriptor_t seq_q, seq_kv, offset_q, offset_k, offset_v, offset_o, offset_stats;
  cudnnBackendDescriptor_t q, kt, stats, scale, padding_fill, causal_fill;
};

Bound bind_common(GraphBuilder& g, const Layout& l) {
  Bound t{};
  const Dims seq_dims = {l.b, 1, 1, 1};
  const Dims offset_dims = {l.b + 1, 1, 1, 1};
  t.seq_q = g.tensor(kSeqLenQ, CUDNN_DATA_INT32, seq_dims, kScalar, false, false, nullptr,
                     "sequence lengths (q)");
  t.seq_kv = g.tensor(kSeqLenKv, CUDNN_DATA_INT32, seq_dims, kScalar, false, false, nullptr,
                      "sequence lengths (kv)");
  t.offset_q = g.tensor(kOffsetQ, CUDNN_DATA_INT64, offset_dims, kScalar, false, false, nullptr,
                        "ragged offsets (q)");
  t.offset_k = g.tensor(kOffsetK, CUDNN_DATA_INT64, offset_dims, kScalar, false, false, nullptr,
                        "ragged offsets (k)");
  t.offset_v = g.tensor(kOffsetV, CUDNN_DATA_INT64, offset_dims, kScalar, false, false, nullptr,
                        "ragged offsets (v)");
  t.offset_o = g.tensor(kOffsetO, CUDNN_DATA_INT64, offset_dims, kScalar, false, false, nullptr,
                        "ragged offsets (o)");
  t.offset_stats = g.tensor(kOffsetStats, CUDNN_DATA_INT64, offset_dims, kScalar, false, false,
                            nullptr, "ragged offsets (stats)");
  t.q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, l.packed_dims(l.hq), l.packed_strides(l.hq), false, false,
                 t.offset_q, "q");
  t.kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, l.packed_t_dims(l.hk), l.packed_t_strides(l.hk), false,
                  false, t.offset_k, "k (as K^T)");
  t.stats = g.tensor(kStats, CUDNN_DATA_FLOAT, l.stats_dims(), l.stats_strides(), false, false,
                     t.offset_stats, "softmax statistics");
  t.scale = g.tensor(kScale, CUDNN_DATA_FLOAT, kScalar, kScalar, false, true, nullptr, "scale");
  t.padding_fill = g.tensor(kPaddingFill, CUDNN_DATA_FLOAT, kScalar, kScalar, false, true, nullptr,
                            "padding mask fill");
  t.causal_fill = g.tensor(kCausalFill, CUDNN_DATA_FLOAT, kScalar, kScalar, false, true, nullptr,
                           "causal mask fill");
  return t;
}

// The row and column index (int32) of every score, for a mask; `compute` is the pointwise
// operation's compute type (each mask keeps the one its graph pattern was validated with).
struct IndexGrids {
  cudnnBackendDescriptor_t row;
  cudnnBackendDescriptor_t col;
};
IndexGrids index_grids(GraphBuilder& g, const Layout& l, cudnnBackendDescriptor_t scores,
                       cudnnDataType_t compute, std::string_view mask) {
  const Dims dims = l.score_dims();
  const Dims strides = l.score_strides();
  const std::string row_name = fmt::format("{}: row index", mask);
  const std::string col_name = fmt::format("{}: column index", mask);
  auto* row = g.intermediate(CUDNN_DATA_INT32, dims, strides, row_name);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, compute, scores, nullptr, nullptr, row, row_name, 2);
  auto* col = g.intermediate(CUDNN_DATA_INT32, dims, strides, col_name);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, compute, scores, nullptr, nullptr, col, col_name, 3);
  return {row, col};
}

// Scores outside the batch's sequence length (rows or columns) become -inf.
cudnnBackendDescriptor_t padding_mask(GraphBuilder& g, const Layout& l, const Bound& t,
                                      cudnnBackendDescriptor_t scores) {
  const Dims dims = l.score_dims();
  const Dims strides = l.score_strides();
  const auto [row, col] = index_grids(g, l, scores, CUDNN_DATA_INT32, "padding");
  auto* row_in = g.intermediate(CUDNN_DATA_BOOLEAN, dims, strides, "padding: row < seq_len_q");
  g.pointwise(CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, t.seq_q, nullptr, row_in,
              "padding: row < seq_len_q");
  auto* col_in = g.intermediate(CUDNN_DATA_BOOLEAN, dims, strides, "padding: col < seq_len_kv");
  g.pointwise(CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, t.seq_kv, nullptr, col_in,
              "padding: col < seq_len_kv");
  auto* inside = g.intermediate(CUDNN_DATA_BOOLEAN, dims, strides, "padding: inside");
  g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, row_in, col_in, nullptr, inside,
              "padding: inside");
  auto* out = g.intermediate(CUDNN_DATA_FLOAT, dims, strides, "padding: select");
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scores, t.padding_fill, inside, out,
              "padding: select");
  return out;
}

// Scores of keys after the query (column > row, top-left aligned in each batch) become -inf.
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, const Layout& l, const Bound& t,
                                     cudnnBackendDescriptor_t scores) {
  const Dims dims = l.score_dims();
  const Dims strides = l.score_strides();
  const auto [row, col] = index_grids(g, l, scores, CUDNN_DATA_FLOAT, "causal");
  auto* keep = g.intermediate(CUDNN_DATA_BOOLEAN, dims, strides, "causal: row >= col");
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep,
              "causal: row >= col");
  auto* out = g.intermediate(CUDNN_DATA_FLOAT, dims, strides, "causal: select");
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scores, t.causal_fill, keep, out,
              "causal: select");
  return out;
}

// S = (Q K^T) * scale with both masks; the first steps of the forward and the backward.
cudnnBackendDescriptor_t masked_scores(GraphBuilder& g, const Layout& l, const Bound& t,
                                       bool stats_before_causal, cudnnBackendDescriptor_t stats) {
  auto* qk = g.intermediate(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides(), "S = Q K^T");
  g.matmul(t.q, t.kt, qk, t.seq_q, t.seq_kv, nullptr, "S = Q K^T");
  auto* scaled = g.intermediate(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides(), "S * scale");
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, qk, t.scale, nullptr, scaled, "S * scale");
  cudnnBackendDescriptor_t s = padding_mask(g, l, t, scaled);
  if (stats_before_causal) {
    // backward: S - stats (log-probabilities) comes between the two masks, as in cudnn-frontend
    auto* shifted =
        g.intermediate(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides(), "S - stats");
    g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s, stats, nullptr, shifted, "S - stats");
    s = shifted;
  }
  return causal_mask(g, l, t, s);
}

void build_forward_graph(GraphBuilder& g, const Layout& l) {
  const Bound t = bind_common(g, l);
  auto* v = g.tensor(kV, CUDNN_DATA_BFLOAT16, l.packed_dims(l.hk), l.packed_strides(l.hk), false,
                     false, t.offset_v, "v");
  auto* o = g.tensor(kO, CUDNN_DATA_BFLOAT16, l.packed_dims(l.hq), l.packed_strides(l.hq), false,
                     false, t.offset_o, "out");
  cudnnBackendDescriptor_t s = masked_scores(g, l, t, false, nullptr);

  // softmax with statistics: stats = max + log(sum(exp(S - max))), P = exp(S - max) / sum
  auto* max = g.intermediate(CUDNN_DATA_FLOAT, l.row_dims(), l.row_strides(), "softmax: max");
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, max, "softmax: max");
  auto* centred =
      g.intermediate(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides(), "softmax: S - max");
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s, max, nullptr, centred, "softmax: S - max");
  auto* e = g.intermediate(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides(), "softmax: exp");
  g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, centred, nullptr, nullptr, e, "softmax: exp");
  auto* sum = g.intermediate(CUDNN_DATA_FLOAT, l.row_dims(), l.row_strides(), "softmax: sum");
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum, "softmax: sum");
  auto* log_sum = g.intermediate(CUDNN_DATA_FLOAT, l.row_dims(), l.row_strides(), "softmax: log");
  g.pointwise(CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, nullptr, nullptr, log_sum,
              "softmax: log");
  g.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, log_sum, nullptr, t.stats,
              "softmax: stats = max + log");
  // P in bf16: the second matmul's A operand must have the I/O type
  auto* p = g.intermediate(CUDNN_DATA_BFLOAT16, l.score_dims(), l.score_strides(), "softmax: P");
  g.pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, sum, nullptr, p, "softmax: P");
  g.matmul(p, v, o, t.seq_q, nullptr, t.seq_kv, "O = P V");
}

void build_backward_graph(GraphBuilder& g, const Layout& l, bool deterministic) {
  const Bound t = bind_common(g, l);
  auto* vt = g.tensor(kV, CUDNN_DATA_BFLOAT16, l.packed_t_dims(l.hk), l.packed_t_strides(l.hk),
                      false, false, t.offset_v, "v (as V^T)");
  auto* o = g.tensor(kO, CUDNN_DATA_BFLOAT16, l.packed_dims(l.hq), l.packed_strides(l.hq), false,
                     false, t.offset_o, "out");
  auto* d_o = g.tensor(kDo, CUDNN_DATA_BFLOAT16, l.packed_dims(l.hq), l.packed_strides(l.hq), false,
                       false, t.offset_o, "dout");
  auto* dq = g.tensor(kDq, CUDNN_DATA_BFLOAT16, l.packed_dims(l.hq), l.packed_strides(l.hq), false,
                      false, t.offset_q, "dq");
  auto* dk = g.tensor(kDk, CUDNN_DATA_BFLOAT16, l.packed_dims(l.hk), l.packed_strides(l.hk), false,
                      false, t.offset_k, "dk");
  auto* dv = g.tensor(kDv, CUDNN_DATA_BFLOAT16, l.packed_dims(l.hk), l.packed_strides(l.hk), false,
                      false, t.offset_v, "dv");
  auto* one = g.tensor(kOne, CUDNN_DATA_FLOAT, kScalar, kScalar, false, true, nullptr, "one");

  // D = rowsum(dO * O), materialised per token like the statistics (our scratch)
  const Dims od_dims = l.packed_dims(l.hq);
  const Dims od_strides = {l.hq * l.s * l.d, l.s * l.d, l.hq * l.d, 1};
  auto* prod = g.intermediate(CUDNN_DATA_FLOAT, od_dims, od_strides, "D: dO * O");
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d_o, o, nullptr, prod, "D: dO * O");
  auto* rowsum = g.intermediate(CUDNN_DATA_FLOAT, l.row_dims(), l.row_strides(), "D: row sum");
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, rowsum, "D: row sum");
  auto* dot = g.tensor(kRowDot, CUDNN_DATA_FLOAT, l.stats_dims(), l.stats_strides(), false, false,
                       t.offset_stats, "D (row sums)");
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, rowsum, one, nullptr, dot, "D: store");

  // P = exp(S - stats) with the masks
  cudnnBackendDescriptor_t s = masked_scores(g, l, t, true, t.stats);
  auto* p = g.intermediate(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides(), "P = exp");
  g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, s, nullptr, nullptr, p, "P = exp");

  // GQA: dK and dV are first computed per query head, (B, hq, S, D) packed like q in our
  // scratch, then summed over each KV head's group. Their ragged offsets are those of dk/dv
  // (cu * hk * D): cuDNN scales them by hq / hk itself (as cudnn-frontend's
  // max_total_seq_len_kv path expects), which keeps the buffers at N tokens instead of B * S.
  const bool gqa = l.hq != l.hk;
  // dV = P^T dO
  auto* pt = g.intermediate(CUDNN_DATA_BFLOAT16, l.score_dims(), l.score_t_strides(), "P^T");
  g.reshape(p, pt, "P^T");
  if (gqa) {
    auto* dv_full = g.tensor(kDvFull, CUDNN_DATA_BFLOAT16, l.packed_dims(l.hq),
                             l.packed_strides(l.hq), false, false, t.offset_v, "dV per query head");
    g.matmul(pt, d_o, dv_full, t.seq_kv, nullptr, t.seq_q, "dV = P^T dO");
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dv, "dV: sum over the head group");
  } else {
    g.matmul(pt, d_o, dv, t.seq_kv, nullptr, t.seq_q, "dV = P^T dO");
  }

  // dS = P * (dO V^T - D) * scale
  auto* dp = g.intermediate(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides(), "dP = dO V^T");
  g.matmul(d_o, vt, dp, t.seq_q, t.seq_kv, nullptr, "dP = dO V^T");
  auto* centred = g.intermediate(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides(), "dP - D");
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, dot, nullptr, centred, "dP - D");
  auto* weighted =
      g.intermediate(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides(), "P (dP - D)");
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, centred, p, nullptr, weighted, "P (dP - D)");
  auto* ds = g.intermediate(CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides(), "dS");
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, weighted, t.scale, nullptr, ds, "dS");

  // dK = dS^T Q (per query head, then summed over the group)
  auto* dst = g.intermediate(CUDNN_DATA_BFLOAT16, l.score_dims(), l.score_t_strides(), "dS^T");
  g.reshape(ds, dst, "dS^T");
  if (gqa) {
    auto* dk_full = g.tensor(kDkFull, CUDNN_DATA_BFLOAT16, l.packed_dims(l.hq),
                             l.packed_strides(l.hq), false, false, t.offset_k, "dK per query head");
    g.matmul(dst, t.q, dk_full, t.seq_kv, nullptr, t.seq_q, "dK = dS^T Q");
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dk, "dK: sum over the head group");
  } else {
    g.matmul(dst, t.q, dk, t.seq_kv, nullptr, t.seq_q, "dK = dS^T Q");
  }

  // dQ = dS K: K^T viewed back as K
  auto* k = g.intermediate(CUDNN_DATA_BFLOAT16, l.packed_dims(l.hk), l.packed_strides(l.hk), "K",
                           t.offset_k);
  g.reshape(t.kt, k, "K");
  if (deterministic) {
    // written once per element (cuDNN keeps dP in its workspace): reproducible bits
    g.matmul(ds, k, dq, t.seq_q, nullptr, t.seq_kv, "dQ = dS K");
  } else {
    // fp32 accumulator in our scratch (packed like dq), then converted
    auto* dq_accum = g.tensor(kDqAccum, CUDNN_DATA_FLOAT, l.packed_dims(l.hq),
                              l.packed_strides(l.hq), false, false, t.offset_q, "dQ accumulator");
    g.matmul(ds, k, dq_accum, t.seq_q, nullptr, t.seq_kv, "dQ = dS K");
    g.pointwise(CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_accum, nullptr, nullptr, dq,
                "dQ: convert");
  }
}

// A finalised execution plan and everything it was built from.
struct Plan {
  explicit Plan(std::string context) : graph(std::move(context)) {}
  GraphBuilder graph;
  Descriptor op_graph;
  Descriptor config;
  Descriptor plan;
  std::int64_t workspace = 0;
  std::string engine;
};

// The engine behind a configuration, for logs ("engine 7"); never fails the caller.
std::string engine_name(cudnnBackendDescriptor_t config) {
  cudnnBackendDescriptor_t raw = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &raw) != CUDNN_STATUS_SUCCESS) {
    return "engine ?";
  }
  const Descriptor engine(raw);
  std::int64_t count = 0;
  std::int64_t index = -1;
  if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               1, &count, &raw) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                               &count, &index) != CUDNN_STATUS_SUCCESS) {
    return "engine ?";
  }
  return fmt::format("engine {}", index);
}

std::int64_t bucket(std::int64_t n, std::int64_t minimum) { return cudnn_bucket(n, minimum); }

std::string shape_refusal(const AttentionShape& shape) {
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0) {
    return fmt::format("{} heads are not a multiple of {} kv heads", shape.n_heads,
                       shape.n_kv_heads);
  }
  // A multiple of 16, not only of 8: the backward keeps its fp32 scratch (dQ accumulator, row
  // sums, per-query-head dK/dV) packed like the inputs, which cudnn-frontend avoids for other
  // head sizes ("d is not a multiple of 16 has a known functional issue").
  if (shape.head_dim <= 0 || shape.head_dim % 16 != 0 || shape.head_dim > kMaxHeadDim) {
    return fmt::format("head_dim {} (cuDNN attention here: a multiple of 16, at most {})",
                       shape.head_dim, kMaxHeadDim);
  }
  return {};
}

PlanKey bucket_of(std::int64_t segments, std::int64_t longest, std::int64_t heads,
                  std::int64_t kv_heads, std::int64_t head_dim, bool backward, bool deterministic) {
  return {backward,
          backward && deterministic,
          bucket(segments, 1),
          bucket(longest, kMinSeqBucket),
          heads,
          kv_heads,
          head_dim};
}

// Empty when usable; the reason when cuDNN attention does not take it. Throws when too small.
// cuDNN's tensors must be 16-byte aligned; lse is only touched by our own transpose kernel.
std::string check_view(ConstTensorView x, DType dtype, std::int64_t count, std::string_view op,
                       std::string_view name, bool cudnn_reads = true) {
  if (x.dtype() != dtype) {
    return fmt::format("'{}' is {}, cuDNN attention takes {}", name, kernels::dtype_name(x.dtype()),
                       kernels::dtype_name(dtype));
  }
  if (x.numel() < count) {
    throw core::internal_error(fmt::format("cuDNN attention {}: '{}' has {} elements, needs {}", op,
                                           name, x.numel(), count));
  }
  if (cudnn_reads && count > 0 &&
      reinterpret_cast<std::uintptr_t>(x.data()) % kAlignment != 0) {  // NOLINT
    return fmt::format("'{}' is not {}-byte aligned", name, kAlignment);
  }
  return {};
}

// An input's pointer for a variant pack, which takes void* for every tensor, those cuDNN only
// reads included.
void* input(ConstTensorView x) {
  return const_cast<void*>(x.data());  // NOLINT(cppcoreguidelines-pro-type-const-cast)
}

// Device pointers of the per-call segment tables (see detail::sdpa_tables) in the scratch.
struct Tables {
  std::int32_t* seq_len = nullptr;
  std::int64_t* offset_q = nullptr;
  std::int64_t* offset_kv = nullptr;
  std::int64_t* offset_stats = nullptr;
};
using TablesAt = CudnnTablesAt;

TablesAt reserve_tables(Carver& carve, std::int64_t batch) {
  return carve_cudnn_tables(carve, batch);
}

Tables place_tables(void* base, const TablesAt& where) {
  return {at<std::int32_t>(base, where.seq_len), at<std::int64_t>(base, where.offset_q),
          at<std::int64_t>(base, where.offset_kv), at<std::int64_t>(base, where.offset_stats)};
}

std::string join_first(const std::vector<std::string>& parts, std::size_t shown) {
  std::string text;
  for (std::size_t i = 0; i < std::min(parts.size(), shown); ++i) {
    if (i > 0) text += "; ";
    text += parts[i];
  }
  if (parts.size() > shown) text += fmt::format("; ... ({} more)", parts.size() - shown);
  return text;
}

// Builds the graph, asks cuDNN's heuristics (mode A, then the fallback list) for engine
// configurations and keeps the first that finalises within the workspace limit. Refusals by
// cuDNN come back as nullptr with `why`; failures of the library itself throw.
// `handle` (a real GPU) or `device` (a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, for device-less
// compilation) says which GPU the plan is for. Without a GPU driver (device-less check on a
// build machine, with the toolkit's stub libcuda), an engine that accepted the graph and compiled
// its kernels still fails to load them; such a plan is returned unfinalised (plan->plan empty).
std::unique_ptr<Plan> build_plan(const PlanKey& key, cudnnHandle_t handle,
                                 cudnnBackendDescriptor_t device, std::size_t max_workspace,
                                 std::string& why) {
  auto plan = std::make_unique<Plan>(describe(key));
  const std::string& context = plan->graph.context();
  const Layout layout{key.batch, key.seq, key.heads, key.kv_heads, key.head_dim};
  if (key.backward) {
    build_backward_graph(plan->graph, layout, key.deterministic);
  } else {
    build_forward_graph(plan->graph, layout);
  }

  plan->op_graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, context, "operation graph");
  const auto& ops = plan->graph.operations();
  set(plan->op_graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
      static_cast<std::int64_t>(ops.size()), ops.data(), context, "operation graph: operations");
  if (handle != nullptr) {
    set(plan->op_graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
        context, "operation graph: handle");
  }
  if (const cudnnStatus_t status = cudnnBackendFinalize(plan->op_graph.get());
      status != CUDNN_STATUS_SUCCESS) {
    why = refusal(status, "operation graph not supported");
    return nullptr;
  }

  std::vector<std::string> refusals;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "fallback heuristics";
    const Descriptor heuristics = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, context, mode_name);
    set_descriptor(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, plan->op_graph.get(),
                   context, mode_name);
    set(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, context,
        mode_name);
    if (device != nullptr) {
      set_descriptor(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, device, context,
                     mode_name);
    }
    if (const cudnnStatus_t status = cudnnBackendFinalize(heuristics.get());
        status != CUDNN_STATUS_SUCCESS) {
      refusals.push_back(refusal(status, mode_name));
      continue;
    }
    std::int64_t count = 0;
    checked(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
            context, "engine configuration count");
    if (count <= 0) {
      refusals.push_back(fmt::format("{}: no engine configuration", mode_name));
      continue;
    }
    // cuDNN fills descriptors we create beforehand.
    std::vector<Descriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (std::int64_t i = 0; i < count; ++i) {
      configs.push_back(
          create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, context, "engine configuration"));
      raw.push_back(configs.back().get());
    }
    std::int64_t returned = 0;
    checked(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data()),
            context, "engine configurations");
    if (returned <= 0) {
      refusals.push_back(fmt::format(
          "{}: none of {} engine configurations passed cuDNN's support checks (details: "
          "CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr)",
          mode_name, count));
    }
    for (std::int64_t i = 0; i < std::min(returned, count); ++i) {
      const auto index = static_cast<std::size_t>(i);
      Descriptor candidate = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, context, "plan");
      set_descriptor(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[index], context,
                     "plan: engine configuration");
      // Finalising compiles the kernels (seconds for some engines); a refusal tries the next.
      if (const cudnnStatus_t status = cudnnBackendFinalize(candidate.get());
          status != CUDNN_STATUS_SUCCESS) {
        if (device != nullptr && status == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER) {
          plan->engine = engine_name(raw[index]) + " (compiled; not loaded: no usable GPU driver)";
          plan->config = std::move(configs[index]);
          plan->workspace = -1;
          return plan;
        }
        refusals.push_back(
            refusal(status, fmt::format("{} {}", engine_name(raw[index]), mode_name)));
        continue;
      }
      std::int64_t workspace = 0;
      std::int64_t returned_count = 0;
      checked(cudnnBackendGetAttribute(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &returned_count, &workspace),
              context, "plan workspace size");
      if (workspace < 0 || static_cast<std::size_t>(workspace) > max_workspace) {
        refusals.push_back(fmt::format("{} needs {} bytes of workspace (limit {})",
                                       engine_name(raw[index]), workspace, max_workspace));
        continue;
      }
      plan->engine = engine_name(raw[index]);
      plan->config = std::move(configs[index]);
      plan->plan = std::move(candidate);
      plan->workspace = workspace;
      return plan;
    }
  }
  constexpr std::size_t kShown = 4;
  why = "no engine accepted the graph; " + join_first(refusals, kShown);
  return nullptr;
}

}  // namespace

// ---- the component -------------------------------------------------------------------------

class CudnnAttention::Impl {
 public:
  explicit Impl(CudnnAttentionOptions options) : options_(options) {}
  // No stream synchronisation here: the stream may already be gone (it belongs to the caller);
  // freeing the device buffer waits for the device's outstanding work, and kernels captured
  // their parameters at launch, so the plans can go.
  ~Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  Impl(Impl&&) = delete;
  Impl& operator=(Impl&&) = delete;

  bool forward(const kernels::AttentionArgs& a, const AttentionShape& shape, cudaStream_t stream);
  bool backward(const kernels::AttentionBackwardArgs& a, const AttentionShape& shape,
                cudaStream_t stream);

  [[nodiscard]] const std::string& reason() const { return reason_; }
  [[nodiscard]] std::size_t plan_count() const { return plans_.size(); }
  [[nodiscard]] std::size_t buffer_bytes() const { return buffer_.bytes(); }
  [[nodiscard]] std::int64_t largest_plan_workspace() const {
    std::int64_t largest = 0;
    for (const auto& [key, plan] : plans_)
      if (plan) largest = std::max(largest, plan->workspace);
    return largest;
  }
  [[nodiscard]] std::string describe_plans() const {
    std::string text;
    for (const auto& [key, plan] : plans_) {
      text +=
          fmt::format("{}: {}, workspace {} bytes\n", describe(key), plan->engine, plan->workspace);
    }
    return text;
  }

 private:
  // The per-call extents after validation.
  struct Call {
    std::int64_t tokens = 0;
    std::int64_t heads = 0;
    std::int64_t kv_heads = 0;
    std::int64_t head_dim = 0;
    int segments = 0;
    std::int64_t longest = 0;
  };
  bool refuse(std::string reason) {
    reason_ = std::move(reason);
    return false;
  }
  [[nodiscard]] std::string check_shape(const AttentionShape& shape) const;
  [[nodiscard]] Call check_segments(const AttentionShape& shape, ConstTensorView cu_seqlens,
                                    std::span<const std::int32_t> host_cu,
                                    std::string_view op) const;
  std::string prepare(cudaStream_t stream);
  const Plan* find_plan(const PlanKey& key);
  [[nodiscard]] PlanKey key_for(const Call& call, bool backward) const {
    return bucket_of(call.segments, call.longest, call.heads, call.kv_heads, call.head_dim,
                     backward, options_.deterministic);
  }
  void fill_tables(const Tables& t, ConstTensorView cu_seqlens, const Call& call,
                   std::int64_t batch);
  void execute(const Plan& plan, std::span<const std::int64_t> uids,
               std::span<void* const> pointers, void* workspace);

  CudnnAttentionOptions options_;
  std::string reason_;
  std::string unavailable_;  // set once when cuDNN cannot be used on this process/GPU at all
  // Set once when this GPU's deterministic backward is not one this graph can promise.
  std::string deterministic_backward_refusal_;
  bool checked_environment_ = false;
  Handle handle_;  // declared before the plans: destroyed after them
  cudaStream_t stream_ = nullptr;
  bool stream_set_ = false;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
  std::map<PlanKey, std::string> refused_;
  DeviceBuffer buffer_;
};

std::string CudnnAttention::Impl::check_shape(const AttentionShape& shape) const {
  return shape_refusal(shape);
}

CudnnAttention::Impl::Call CudnnAttention::Impl::check_segments(
    const AttentionShape& shape, ConstTensorView cu_seqlens, std::span<const std::int32_t> host_cu,
    std::string_view op) const {
  Call call{shape.tokens,   shape.n_heads,    shape.n_kv_heads,
            shape.head_dim, shape.n_segments, shape.max_segment};
  if (shape.tokens < 0 || shape.n_segments < 0 || shape.max_segment < 0 ||
      (shape.tokens > 0 && (shape.n_segments == 0 || shape.max_segment == 0))) {
    throw core::internal_error(
        fmt::format("cuDNN attention {}: inconsistent shape ({} tokens, {} segments, longest {})",
                    op, shape.tokens, shape.n_segments, shape.max_segment));
  }
  if (cu_seqlens.numel() < static_cast<std::int64_t>(shape.n_segments) + 1) {
    throw core::internal_error(
        fmt::format("cuDNN attention {}: cu_seqlens has {} elements, needs {}", op,
                    cu_seqlens.numel(), shape.n_segments + 1));
  }
  if (host_cu.empty()) return call;
  if (host_cu.size() < static_cast<std::size_t>(shape.n_segments) + 1 || host_cu[0] != 0 ||
      host_cu[static_cast<std::size_t>(shape.n_segments)] != shape.tokens) {
    throw core::internal_error(
        fmt::format("cuDNN attention {}: host cu_seqlens must hold {} offsets from 0 to {}", op,
                    shape.n_segments + 1, shape.tokens));
  }
  std::int64_t longest = 0;
  for (std::size_t i = 1; i <= static_cast<std::size_t>(shape.n_segments); ++i) {
    const std::int64_t length = host_cu[i] - host_cu[i - 1];
    if (length < 0) {
      throw core::internal_error(
          fmt::format("cuDNN attention {}: cu_seqlens decreases at {}", op, i));
    }
    longest = std::max(longest, length);
  }
  if (longest > shape.max_segment) {
    throw core::internal_error(
        fmt::format("cuDNN attention {}: longest segment {} exceeds shape.max_segment {}", op,
                    longest, shape.max_segment));
  }
  call.longest = longest;
  return call;
}

// Once: can cuDNN attention run here at all? Then the handle and the stream of this call.
std::string CudnnAttention::Impl::prepare(cudaStream_t stream) {
  if (!checked_environment_) {
    const std::size_t version = cudnnGetVersion();
    int device = 0;
    int major = 0;
    int minor = 0;
    check(cudaGetDevice(&device), "cuDNN attention: cudaGetDevice");
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
          "cuDNN attention: compute capability");
    check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
          "cuDNN attention: compute capability");
    unavailable_ = cudnn_attention_unavailable(version, major, minor);
    if (unavailable_.empty()) {
      cudnnHandle_t raw = nullptr;
      const cudnnStatus_t status = cudnnCreate(&raw);
      if (status != CUDNN_STATUS_SUCCESS) {
        unavailable_ = refusal(status, "cudnnCreate");
      } else {
        handle_.reset(raw);
      }
      deterministic_backward_refusal_ = cudnn_deterministic_backward_unavailable(major, minor);
    }
    checked_environment_ = true;  // only once the questions above got answers
  }
  if (!unavailable_.empty()) return unavailable_;
  if (!stream_set_ || stream != stream_) {
    // the buffer is shared by all calls: let the previous stream finish with it
    if (stream_set_) check(cudaStreamSynchronize(stream_), "cuDNN attention: change of stream");
    checked(cudnnSetStream(handle_.get(), stream), "cuDNN attention", "cudnnSetStream");
    stream_ = stream;
    stream_set_ = true;
  }
  return {};
}

const Plan* CudnnAttention::Impl::find_plan(const PlanKey& key) {
  if (const auto found = plans_.find(key); found != plans_.end()) return found->second.get();
  if (const auto refused = refused_.find(key); refused != refused_.end()) {
    reason_ = refused->second;
    return nullptr;
  }
  std::string why;
  std::unique_ptr<Plan> plan =
      build_plan(key, handle_.get(), nullptr, options_.max_plan_workspace_bytes, why);
  if (plan == nullptr) {
    reason_ = fmt::format("{}: {}", describe(key), why);
    refused_.emplace(key, reason_);
    return nullptr;
  }
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

void CudnnAttention::Impl::fill_tables(const Tables& t, ConstTensorView cu_seqlens,
                                       const Call& call, std::int64_t batch) {
  detail::sdpa_tables(static_cast<const std::int32_t*>(cu_seqlens.data()), call.segments,
                      static_cast<int>(batch), call.heads * call.head_dim,
                      call.kv_heads * call.head_dim, call.heads, t.seq_len, t.offset_q, t.offset_kv,
                      t.offset_stats, stream_);
}

void CudnnAttention::Impl::execute(const Plan& plan, std::span<const std::int64_t> uids,
                                   std::span<void* const> pointers, void* workspace) {
  const std::string& context = plan.graph.context();
  const Descriptor pack = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, context, "variant pack");
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
      static_cast<std::int64_t>(pointers.size()), pointers.data(), context,
      "variant pack: pointers");
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
      static_cast<std::int64_t>(uids.size()), uids.data(), context, "variant pack: ids");
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, context,
      "variant pack: workspace");
  checked(cudnnBackendFinalize(pack.get()), context, "variant pack");
  checked(cudnnBackendExecute(handle_.get(), plan.plan.get(), pack.get()), context, "execute");
}

bool CudnnAttention::Impl::forward(const kernels::AttentionArgs& a, const AttentionShape& shape,
                                   cudaStream_t stream) {
  reason_.clear();
  if (std::string why = check_shape(shape); !why.empty()) return refuse(std::move(why));
  const ConstTensorView cu_seqlens = a.segments.cu_seqlens;
  const ConstTensorView q = a.q;
  const ConstTensorView k = a.k;
  const ConstTensorView v = a.v;
  const kernels::TensorView out = a.out;
  const kernels::TensorView lse = a.lse;
  const Call call = check_segments(shape, cu_seqlens, a.segments.host, "forward");
  const std::int64_t n = call.tokens;
  const std::int64_t qs = call.heads * call.head_dim;
  const std::int64_t kvs = call.kv_heads * call.head_dim;
  for (const std::string& why :
       {check_view(q, DType::bf16, n * qs, "forward", "q"),
        check_view(k, DType::bf16, n * kvs, "forward", "k"),
        check_view(v, DType::bf16, n * kvs, "forward", "v"),
        check_view(out, DType::bf16, n * qs, "forward", "out"),
        check_view(lse, DType::f32, n * call.heads, "forward", "lse", false)}) {
    if (!why.empty()) return refuse(why);
  }
  if (cu_seqlens.dtype() != DType::i32) return refuse("cu_seqlens must be i32");
  if (n == 0) return true;  // nothing to compute or write
  if (std::string why = prepare(stream); !why.empty()) return refuse(std::move(why));
  const PlanKey key = key_for(call, false);
  const Plan* plan = find_plan(key);
  if (plan == nullptr) return false;

  // scratch: segment tables, token-major statistics (N + margin, heads), cuDNN's workspace
  Carver carve;
  const TablesAt tables_at = reserve_tables(carve, key.batch);
  const std::size_t stats_at = carve.reserve_bytes(
      static_cast<std::size_t>((n + kTokenMargin) * call.heads) * sizeof(float));
  const std::size_t workspace_at = carve.reserve_bytes(static_cast<std::size_t>(plan->workspace));
  void* base = buffer_.get(carve.total(), stream_);
  const Tables t = place_tables(base, tables_at);
  auto* stats = at<float>(base, stats_at);
  fill_tables(t, cu_seqlens, call, key.batch);

  auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(call.head_dim)));
  float padding_fill = -std::numeric_limits<float>::infinity();
  float causal_fill = -std::numeric_limits<float>::infinity();
  const std::array<std::int64_t, 15> uids = {
      kQ,       kK,       kV,       kO,           kStats, kSeqLenQ,     kSeqLenKv,  kOffsetQ,
      kOffsetK, kOffsetV, kOffsetO, kOffsetStats, kScale, kPaddingFill, kCausalFill};
  const std::array<void*, 15> pointers = {input(q),    input(k),      input(v),    out.data(),
                                          stats,       t.seq_len,     t.seq_len,   t.offset_q,
                                          t.offset_kv, t.offset_kv,   t.offset_q,  t.offset_stats,
                                          &scale,      &padding_fill, &causal_fill};
  execute(*plan, uids, pointers, at<void>(base, workspace_at));
  // lse (heads, N) from the token-major statistics (N, heads)
  detail::transpose_f32(static_cast<float*>(lse.data()), stats, n, call.heads, stream_);
  return true;
}

bool CudnnAttention::Impl::backward(const kernels::AttentionBackwardArgs& a,
                                    const AttentionShape& shape, cudaStream_t stream) {
  reason_.clear();
  if (std::string why = check_shape(shape); !why.empty()) return refuse(std::move(why));
  const ConstTensorView cu_seqlens = a.segments.cu_seqlens;
  const ConstTensorView q = a.q;
  const ConstTensorView k = a.k;
  const ConstTensorView v = a.v;
  const ConstTensorView out = a.out;
  const ConstTensorView dout = a.dout;
  const ConstTensorView lse = a.lse;
  const kernels::TensorView dq = a.dq;
  const kernels::TensorView dk = a.dk;
  const kernels::TensorView dv = a.dv;
  const Call call = check_segments(shape, cu_seqlens, a.segments.host, "backward");
  const std::int64_t n = call.tokens;
  const std::int64_t qs = call.heads * call.head_dim;
  const std::int64_t kvs = call.kv_heads * call.head_dim;
  for (const std::string& why :
       {check_view(q, DType::bf16, n * qs, "backward", "q"),
        check_view(k, DType::bf16, n * kvs, "backward", "k"),
        check_view(v, DType::bf16, n * kvs, "backward", "v"),
        check_view(out, DType::bf16, n * qs, "backward", "out"),
        check_view(dout, DType::bf16, n * qs, "backward", "dout"),
        check_view(lse, DType::f32, n * call.heads, "backward", "lse", false),
        check_view(dq, DType::bf16, n * qs, "backward", "dq"),
        check_view(dk, DType::bf16, n * kvs, "backward", "dk"),
        check_view(dv, DType::bf16, n * kvs, "backward", "dv")}) {
    if (!why.empty()) return refuse(why);
  }
  if (cu_seqlens.dtype() != DType::i32) return refuse("cu_seqlens must be i32");
  if (n == 0) return true;
  if (std::string why = prepare(stream); !why.empty()) return refuse(std::move(why));
  if (options_.deterministic && !deterministic_backward_refusal_.empty()) {
    return refuse(deterministic_backward_refusal_);
  }
  const PlanKey key = key_for(call, true);
  const Plan* plan = find_plan(key);
  if (plan == nullptr) return false;

  // scratch: tables, statistics and row sums D (N + margin, heads), the fp32 dQ accumulator
  // (N + margin, heads, head_dim) unless deterministic, per-query-head dK/dV for GQA, cuDNN's
  // workspace
  // (cudnn_attention_sizes.hpp, which the memory plan counts too)
  Carver carve;
  const CudnnBackwardScratch scratch = carve_cudnn_backward(
      carve, n, call.heads, call.kv_heads, call.head_dim, key.batch, key.deterministic);
  const TablesAt tables_at{scratch.seq_len, scratch.offset_q, scratch.offset_kv,
                           scratch.offset_stats};
  const std::size_t stats_at = scratch.stats;
  const std::size_t dot_at = scratch.dot;
  const std::size_t accum_bytes = scratch.accum_bytes;
  const std::size_t accum_at = scratch.accum;
  const bool gqa = call.heads != call.kv_heads;
  const std::size_t dk_full_at = scratch.dk_full;
  const std::size_t dv_full_at = scratch.dv_full;
  const std::size_t workspace_at = carve.reserve_bytes(static_cast<std::size_t>(plan->workspace));
  void* base = buffer_.get(carve.total(), stream_);
  const Tables t = place_tables(base, tables_at);
  auto* stats = at<float>(base, stats_at);
  fill_tables(t, cu_seqlens, call, key.batch);
  // token-major statistics (N, heads) from lse (heads, N)
  detail::transpose_f32(stats, static_cast<const float*>(lse.data()), call.heads, n, stream_);
  if (accum_bytes > 0) {
    // cuDNN >= 9.6 clears it itself (cudnn-frontend stopped doing so); cheap insurance
    if (const cudaError_t status =
            cudaMemsetAsync(at<void>(base, accum_at), 0, accum_bytes, stream_);
        status != cudaSuccess) {
      check(status, fmt::format("{}: clear the dQ accumulator", describe(key)));
    }
  }

  auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(call.head_dim)));
  float padding_fill = -std::numeric_limits<float>::infinity();
  float causal_fill = -std::numeric_limits<float>::infinity();
  float one = 1.0F;
  std::vector<std::int64_t> uids = {
      kQ,           kK,          kV,       kO,       kDo,      kStats,       kSeqLenQ,
      kSeqLenKv,    kOffsetQ,    kOffsetK, kOffsetV, kOffsetO, kOffsetStats, kScale,
      kPaddingFill, kCausalFill, kOne,     kRowDot,  kDq,      kDk,          kDv};
  std::vector<void*> pointers = {
      input(q),       input(k),  input(v),      input(out),   input(dout), stats,
      t.seq_len,      t.seq_len, t.offset_q,    t.offset_kv,  t.offset_kv, t.offset_q,
      t.offset_stats, &scale,    &padding_fill, &causal_fill, &one,        at<float>(base, dot_at),
      dq.data(),      dk.data(), dv.data()};
  if (!key.deterministic) {
    uids.push_back(kDqAccum);
    pointers.push_back(at<float>(base, accum_at));
  }
  if (gqa) {
    uids.push_back(kDkFull);
    pointers.push_back(at<void>(base, dk_full_at));
    uids.push_back(kDvFull);
    pointers.push_back(at<void>(base, dv_full_at));
  }
  execute(*plan, uids, pointers, at<void>(base, workspace_at));
  return true;
}

// ---- public interface ------------------------------------------------------------------------

std::string cudnn_attention_unavailable(std::size_t cudnn_version, int cc_major, int cc_minor) {
  if (cudnn_version < kMinRuntimeVersion) {
    return fmt::format("cuDNN runtime {} is older than {}", cudnn_version, kMinRuntimeVersion);
  }
  if (cc_major != 9 && cc_major != 10) {
    // packed (THD) statistics in the backward: Hopper and datacenter Blackwell only
    return fmt::format("GPU sm_{}{} (cuDNN attention here: sm_90 or sm_100)", cc_major, cc_minor);
  }
  return {};
}

std::string cudnn_deterministic_backward_unavailable(int cc_major, int cc_minor) {
  // On Blackwell, cudnn-frontend gets a deterministic backward only from cuDNN 9.18 on and by
  // pinning one engine and its knobs; this graph takes the heuristic's choice, which there may
  // reduce in any order. The fallback attention's backward is deterministic.
  if (cc_major == 10) {
    return fmt::format("a deterministic backward on sm_{}{} (cuDNN attention here: sm_90)",
                       cc_major, cc_minor);
  }
  return {};
}

CudnnAttention::CudnnAttention(CudnnAttentionOptions options)
    : impl_(std::make_unique<Impl>(options)) {}
CudnnAttention::~CudnnAttention() = default;

bool CudnnAttention::forward(const kernels::AttentionArgs& a, const AttentionShape& shape,
                             cudaStream_t stream) {
  return impl_->forward(a, shape, stream);
}

bool CudnnAttention::backward(const kernels::AttentionBackwardArgs& a, const AttentionShape& shape,
                              cudaStream_t stream) {
  return impl_->backward(a, shape, stream);
}

std::string CudnnAttention::compile_offline(std::string_view device_properties_json,
                                            const AttentionShape& shape,
                                            CudnnAttentionOptions options, std::string* plans) {
  if (std::string why = shape_refusal(shape); !why.empty()) return why;
  if (shape.n_segments <= 0 || shape.max_segment <= 0) {
    return "compile_offline needs at least one segment of at least one token";
  }
#if CUDNN_VERSION >= 91100
  if (cudnnGetVersion() < 91100) {
    return fmt::format("device-less compilation needs cuDNN 9.11, this is {}", cudnnGetVersion());
  }
  const std::string context = "cuDNN attention: device properties";
  const Descriptor device = create(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, context, "descriptor");
  set(device.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
      static_cast<std::int64_t>(device_properties_json.size()), device_properties_json.data(),
      context, "JSON representation");
  if (const cudnnStatus_t status = cudnnBackendFinalize(device.get());
      status != CUDNN_STATUS_SUCCESS) {
    return refusal(status, "device properties");
  }
  for (const bool backward : {false, true}) {
    const PlanKey key =
        bucket_of(shape.n_segments, shape.max_segment, shape.n_heads, shape.n_kv_heads,
                  shape.head_dim, backward, options.deterministic);
    std::string why;
    const std::unique_ptr<Plan> plan =
        build_plan(key, nullptr, device.get(), options.max_plan_workspace_bytes, why);
    if (plan == nullptr) return fmt::format("{}: {}", describe(key), why);
    if (plans != nullptr) {
      *plans +=
          fmt::format("{}: {}, workspace {} bytes\n", describe(key), plan->engine, plan->workspace);
    }
  }
  return {};
#else
  (void)device_properties_json;
  (void)options;
  (void)plans;
  return "device-less compilation needs cuDNN 9.11 headers";
#endif
}

std::string CudnnAttention::last_unsupported_reason() const { return impl_->reason(); }
std::size_t CudnnAttention::plan_count() const { return impl_->plan_count(); }
std::size_t CudnnAttention::buffer_bytes() const { return impl_->buffer_bytes(); }
std::int64_t CudnnAttention::largest_plan_workspace() const {
  return impl_->largest_plan_workspace();
}
std::string CudnnAttention::describe_plans() const { return impl_->describe_plans(); }

}  // namespace l3::cuda
