#include "parallel/gradient_exchange.hpp"

#include <fmt/format.h>

#include <cstring>

#include "core/error.hpp"
#include "dist/collectives.hpp"

#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
#include "parallel/nccl_exchange.hpp"
#endif

// Values moved without arithmetic travel as their bits: bf16 as 16-bit integers.
template <>
struct l3::dist::MpiType<l3::kernels::BFloat16> {
  static MPI_Datatype get() noexcept { return MPI_UINT16_T; }
};

namespace l3::parallel {

namespace {

// Counts and displacements (relative to the bucket) of the pieces, as MPI wants them.
struct PieceCounts {
  std::vector<int> counts;
  std::vector<int> displacements;
};

PieceCounts piece_counts(FlatRange bucket, std::span<const FlatRange> pieces) {
  PieceCounts c;
  c.counts.reserve(pieces.size());
  c.displacements.reserve(pieces.size());
  for (const FlatRange& p : pieces) {
    c.counts.push_back(static_cast<int>(p.size()));
    c.displacements.push_back(static_cast<int>(p.begin - bucket.begin));
  }
  return c;
}

// The dtypes the exchange can move without arithmetic: f32, and bf16 as its 16 bits.
void check_transport(kernels::DType dtype) {
  if (dtype == kernels::DType::f32 || dtype == kernels::DType::bf16) return;
  throw core::internal_error(
      fmt::format("gradient exchange: no transport for {}", kernels::dtype_name(dtype)));
}

// MPI_Allgatherv in place of `buffer`'s elements, as their dtype (check_transport).
void all_gatherv(MPI_Comm comm, kernels::TensorView buffer, const PieceCounts& c,
                 std::string_view what) {
  if (buffer.dtype() == kernels::DType::bf16) {
    dist::all_gatherv(comm, buffer.as<kernels::BFloat16>(), c.counts, c.displacements, what);
  } else {
    check_transport(buffer.dtype());
    dist::all_gatherv(comm, buffer.as<float>(), c.counts, c.displacements, what);
  }
}

}  // namespace

MpiExchange::MpiExchange(const dist::World& world, kernels::Ops& ops, bool staged)
    : ops_(ops), comm_(world.duplicate_comm()), rank_(world.rank()), staged_(staged) {}

void MpiExchange::reduce_scatter(kernels::TensorView values, FlatRange bucket,
                                 std::span<const FlatRange> pieces) {
  const PieceCounts c = piece_counts(bucket, pieces);
  const FlatRange mine = pieces[static_cast<std::size_t>(rank_)];
  piece_f32_.resize(static_cast<std::size_t>(mine.size()));
  std::span<const float> send;
  if (staged_) {
    // Widened to fp32 on the host: the sum is rounded to the compute dtype once, at the end.
    bucket_f32_.resize(static_cast<std::size_t>(bucket.size()));
    ops_.copy(kernels::TensorView(std::span<float>(bucket_f32_)),
              values.slice(bucket.begin, bucket.size()));
    send = bucket_f32_;
  } else {
    send = values.slice(bucket.begin, bucket.size()).as<float>();
  }
  dist::reduce_scatter(comm_.get(), send, std::span(piece_f32_), c.counts, dist::ReduceOp::sum,
                       fmt::format("{} gradients", bucket.size()));
  if (mine.size() == 0) return;
  if (staged_) {
    ops_.copy(values.slice(mine.begin, mine.size()),
              kernels::ConstTensorView(std::span<const float>(piece_f32_)));
  } else {
    std::memcpy(values.slice(mine.begin, mine.size()).data(), piece_f32_.data(),
                piece_f32_.size() * sizeof(float));
  }
}

void MpiExchange::all_gather(kernels::TensorView values, FlatRange bucket,
                             std::span<const FlatRange> pieces) {
  const PieceCounts c = piece_counts(bucket, pieces);
  check_transport(values.dtype());
  const kernels::TensorView whole = values.slice(bucket.begin, bucket.size());
  kernels::TensorView buffer = whole;
  kernels::TensorView staging;
  if (staged_) {
    gather_raw_.resize(whole.bytes());
    staging = kernels::TensorView(gather_raw_.data(), values.dtype(), bucket.size());
    const FlatRange mine = pieces[static_cast<std::size_t>(rank_)];
    if (mine.size() > 0) {
      ops_.copy(staging.slice(mine.begin - bucket.begin, mine.size()),
                values.slice(mine.begin, mine.size()));
    }
    buffer = staging;
  }
  all_gatherv(comm_.get(), buffer, c, fmt::format("{} values", bucket.size()));
  if (staged_) ops_.copy(whole, staging);
}

void MpiExchange::all_reduce(kernels::TensorView values, FlatRange range) {
  if (range.size() == 0) return;  // then on every rank: the same piece of each replica
  const kernels::TensorView part = values.slice(range.begin, range.size());
  std::span<float> sums;
  if (staged_) {
    // In fp32 on the host, rounded to the compute dtype once on the way back.
    piece_f32_.resize(static_cast<std::size_t>(range.size()));
    ops_.copy(kernels::TensorView(std::span<float>(piece_f32_)), part);
    sums = piece_f32_;
  } else {
    sums = part.as<float>();
  }
  dist::all_reduce(comm_.get(), sums, dist::ReduceOp::sum,
                   fmt::format("{} gradients", range.size()));
  if (staged_) ops_.copy(part, kernels::ConstTensorView(std::span<const float>(piece_f32_)));
}

std::unique_ptr<GradientExchange> make_gradient_exchange(const dist::World& world,
                                                         kernels::Ops& ops, ExchangeChoice choice) {
  const bool host_memory = ops.backend() == kernels::Backend::cpu;
  // Through host staging buffers even where the buffers are host memory: the GPU fallback's
  // code path, exercised by the CPU tests.
  if (choice == ExchangeChoice::mpi_staged) return std::make_unique<MpiExchange>(world, ops, true);
  if (choice == ExchangeChoice::nccl && host_memory) {
    throw core::usage_error("--grad-exchange nccl needs the CUDA backend (--backend cuda)");
  }
#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
  if (!host_memory && choice != ExchangeChoice::mpi) {
    if (each_rank_has_its_own_gpu(world, ops)) return make_nccl_exchange(world, ops);
    if (choice == ExchangeChoice::nccl) {
      throw core::usage_error(
          "--grad-exchange nccl: ranks of a node share a GPU, which NCCL does not allow (one "
          "rank per GPU, or --grad-exchange mpi)");
    }
  }
#else
  if (choice == ExchangeChoice::nccl) {
    throw core::usage_error("--grad-exchange nccl: this build has no CUDA/NCCL (L3_CUDA=ON)");
  }
#endif
  return std::make_unique<MpiExchange>(world, ops, !host_memory);
}

}  // namespace l3::parallel
