#include "parallel/nccl_exchange.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "parallel/nccl_communicator.hpp"

namespace l3::parallel {

namespace {

ncclDataType_t nccl_type(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::f32:
      return ncclFloat32;
    case kernels::DType::bf16:
      return ncclBfloat16;
    default:
      throw core::internal_error(
          fmt::format("NCCL exchange: no NCCL type for {}", kernels::dtype_name(dtype)));
  }
}

bool even(std::span<const FlatRange> pieces) {
  return std::ranges::all_of(pieces,
                             [&](const FlatRange& p) { return p.size() == pieces.front().size(); });
}

char* element(kernels::TensorView values, std::int64_t index) {
  return static_cast<char*>(values.data()) +
         static_cast<std::size_t>(index) * kernels::dtype_size(values.dtype());
}

class NcclExchange final : public GradientExchange {
 public:
  // shared_stream: queue on that stream (another exchange's, which outlives this one) rather than
  // on one of its own.
  NcclExchange(const dist::World& world, cuda::CudaOps& ops, cudaStream_t shared_stream = nullptr)
      : ops_(ops),
        compute_(ops.stream()),
        owns_stream_(shared_stream == nullptr),
        rank_(world.rank()),
        size_(world.size()) {
    cuda::check(cudaSetDevice(ops.device()), "NCCL exchange: cudaSetDevice");
    comm_ = create_nccl_communicator(world, ops.device());
    std::exception_ptr failure;
    try {
      // Lower number = higher priority: the reductions go ahead of queued compute kernels.
      int least = 0;
      int greatest = 0;
      cuda::check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities");
      if (owns_stream_) {
        cuda::check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
                    "NCCL exchange: cudaStreamCreate");
      } else {
        stream_ = shared_stream;
      }
      cuda::check(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming),
                  "NCCL exchange: cudaEventCreate");
      cuda::check(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming),
                  "NCCL exchange: cudaEventCreate");
      for (cudaEvent_t& e : ticket_events_) {
        cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                    "NCCL exchange: cudaEventCreate");
      }
    } catch (...) {
      failure = std::current_exception();
    }
    try {
      dist::agree_on_failure(world, failure);
    } catch (...) {
      release(true);
      throw;
    }
    // The host's waits for the compute stream (the loss, the gradient norm) poll NCCL's
    // asynchronous errors: a collective whose peer failed would otherwise hold them forever.
    wait_check_ = ops_.add_wait_check([this] { check_async_error(); });
  }

  ~NcclExchange() override { release(broken_ || std::uncaught_exceptions() > 0); }
  NcclExchange(const NcclExchange&) = delete;
  NcclExchange& operator=(const NcclExchange&) = delete;
  NcclExchange(NcclExchange&&) = delete;
  NcclExchange& operator=(NcclExchange&&) = delete;

  [[nodiscard]] std::string_view name() const noexcept override { return "nccl"; }
  [[nodiscard]] bool queued() const noexcept override { return true; }
  [[nodiscard]] bool host_thread_safe() const noexcept override { return false; }
  [[nodiscard]] bool prefers_even_pieces() const noexcept override { return true; }

  std::unique_ptr<GradientExchange> follower(const dist::World& world) override {
    return std::make_unique<NcclExchange>(world, ops_, stream_);
  }

  void reduce_scatter(kernels::TensorView values, FlatRange bucket,
                      std::span<const FlatRange> pieces) override {
    wait_for_compute();
    const ncclDataType_t type = nccl_type(values.dtype());
    const std::string what = fmt::format("reduce-scatter of {} values", bucket.size());
    if (even(pieces)) {
      const auto count = static_cast<std::size_t>(pieces.front().size());
      // In place: rank r's result lands at bucket + r * count, its own piece.
      checked(ncclReduceScatter(element(values, bucket.begin),
                                element(values, pieces[static_cast<std::size_t>(rank_)].begin),
                                count, type, ncclSum, comm_, stream_),
              what);
      return;
    }
    // Uneven pieces: one reduce to each piece's owner, in place, as one group.
    per_piece(values, pieces, what, [&](void* piece, std::size_t count, int owner) {
      return ncclReduce(piece, piece, count, type, ncclSum, owner, comm_, stream_);
    });
  }

  void all_gather(kernels::TensorView values, FlatRange bucket,
                  std::span<const FlatRange> pieces) override {
    wait_for_compute();
    const ncclDataType_t type = nccl_type(values.dtype());
    const std::string what = fmt::format("all-gather of {} values", bucket.size());
    if (even(pieces)) {
      const auto count = static_cast<std::size_t>(pieces.front().size());
      checked(ncclAllGather(element(values, pieces[static_cast<std::size_t>(rank_)].begin),
                            element(values, bucket.begin), count, type, comm_, stream_),
              what);
      return;
    }
    // Uneven pieces: each owner broadcasts its piece, in place, as one group.
    per_piece(values, pieces, what, [&](void* piece, std::size_t count, int owner) {
      return ncclBroadcast(piece, piece, count, type, owner, comm_, stream_);
    });
  }

  void all_reduce(kernels::TensorView values, FlatRange range) override {
    if (range.size() == 0) return;
    wait_for_compute();
    checked(ncclAllReduce(element(values, range.begin), element(values, range.begin),
                          static_cast<std::size_t>(range.size()), nccl_type(values.dtype()),
                          ncclSum, comm_, stream_),
            fmt::format("all-reduce of {} values", range.size()));
  }

  void join() override {
    cuda::check(cudaEventRecord(comm_done_, stream_), "NCCL exchange: record");
    cuda::check(cudaStreamWaitEvent(compute_, comm_done_, 0), "NCCL exchange: compute waits");
    check_async_error();
  }

  std::uint64_t mark() override {
    const std::uint64_t ticket = tickets_made_++;
    cuda::check(cudaEventRecord(ticket_events_[ticket % kTickets], stream_),
                "NCCL exchange: record a ticket");
    return ticket;
  }

  void join_ticket(std::uint64_t ticket) override {
    if (ticket >= tickets_made_ || ticket + kTickets < tickets_made_) {
      throw core::internal_error(
          fmt::format("NCCL exchange: ticket {} is not among the last {} of {}", ticket, kTickets,
                      tickets_made_));
    }
    cuda::check(cudaStreamWaitEvent(compute_, ticket_events_[ticket % kTickets], 0),
                "NCCL exchange: compute waits for a ticket");
    check_async_error();
  }

 private:
  // call(piece pointer, count, owning rank) for every non-empty piece, inside one NCCL group.
  template <typename Call>
  void per_piece(kernels::TensorView values, std::span<const FlatRange> pieces,
                 const std::string& what, Call call) {
    checked(ncclGroupStart(), what);
    try {
      for (int r = 0; r < size_; ++r) {
        const FlatRange p = pieces[static_cast<std::size_t>(r)];
        if (p.size() > 0)
          checked(call(element(values, p.begin), static_cast<std::size_t>(p.size()), r), what);
      }
    } catch (...) {
      ncclGroupEnd();  // leave group mode, or this thread's later NCCL calls (abort) are deferred
      throw;
    }
    checked(ncclGroupEnd(), what);
  }

  // failing: unwinding from an error, when peers may never join a collective already queued.
  // Abort first: it stops NCCL's kernels, which would otherwise spin forever waiting for those
  // peers, and with them a synchronisation of the stream.
  void release(bool failing) noexcept {
    if (wait_check_ >= 0) ops_.remove_wait_check(wait_check_);
    wait_check_ = -1;
    if (comm_ != nullptr && failing) ncclCommAbort(comm_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (comm_ != nullptr && !failing) {
      // The nonblocking way to end: finalize (flushes, may be in progress), then destroy.
      if (settle(comm_, ncclCommFinalize(comm_)) == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (compute_ready_ != nullptr) cudaEventDestroy(compute_ready_);
    if (comm_done_ != nullptr) cudaEventDestroy(comm_done_);
    for (cudaEvent_t& e : ticket_events_) {
      if (e != nullptr) cudaEventDestroy(e);
      e = nullptr;
    }
    if (stream_ != nullptr && owns_stream_) cudaStreamDestroy(stream_);
    comm_ = nullptr;
    compute_ready_ = comm_done_ = nullptr;
    stream_ = nullptr;
  }

  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    checked(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    checked(async, "asynchronous error");
  }

  // check_nccl, remembering a failure: the communicator is then aborted, not destroyed (which
  // waits for peers), even if the caller caught the error and destroys this exchange normally.
  // A call that returned ncclInProgress (the communicator is nonblocking) is waited for first.
  void checked(ncclResult_t status, std::string_view what) {
    status = settle(comm_, status);
    if (status != ncclSuccess) broken_ = true;
    check_nccl(status, what, comm_);
  }

  void wait_for_compute() {
    cuda::check(cudaEventRecord(compute_ready_, compute_), "NCCL exchange: record");
    cuda::check(cudaStreamWaitEvent(stream_, compute_ready_, 0), "NCCL exchange: stream waits");
  }

  cuda::CudaOps& ops_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = true;
  int wait_check_ = -1;  // ops_'s key for check_async_error
  cudaEvent_t compute_ready_ = nullptr;
  cudaEvent_t comm_done_ = nullptr;
  std::array<cudaEvent_t, kTickets> ticket_events_{};  // mark(): ticket t uses t % kTickets
  std::uint64_t tickets_made_ = 0;
  ncclComm_t comm_ = nullptr;
  bool broken_ = false;  // an NCCL call or asynchronous error failed
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

bool each_rank_has_its_own_gpu(const dist::World& world, kernels::Ops& ops) {
  auto* cuda_ops = dynamic_cast<cuda::CudaOps*>(&ops);
  if (cuda_ops == nullptr) return false;
  // The PCI bus id names a GPU whatever CUDA_VISIBLE_DEVICES numbers it as on each rank.
  constexpr int kIdLength = 32;
  std::array<char, kIdLength> mine{};
  cuda::check(cudaDeviceGetPCIBusId(mine.data(), kIdLength, cuda_ops->device()),
              "cudaDeviceGetPCIBusId");
  std::vector<char> all(static_cast<std::size_t>(world.local_size()) * kIdLength);
  dist::all_gather(world.local_comm(), std::span<const char>(mine), std::span(all), "GPU bus ids");
  std::set<std::string> distinct;
  for (int r = 0; r < world.local_size(); ++r) {
    distinct.emplace(all.data() + static_cast<std::ptrdiff_t>(r) * kIdLength);
  }
  const int shared =
      dist::all_reduce(world.comm(), static_cast<int>(distinct.size()) < world.local_size() ? 1 : 0,
                       dist::ReduceOp::max, "GPU sharing");
  return shared == 0;
}

std::unique_ptr<GradientExchange> make_nccl_exchange(const dist::World& world, kernels::Ops& ops) {
  auto* cuda_ops = dynamic_cast<cuda::CudaOps*>(&ops);
  if (cuda_ops == nullptr) {
    throw core::usage_error("the NCCL gradient exchange needs the CUDA backend");
  }
  return std::make_unique<NcclExchange>(world, *cuda_ops);
}

}  // namespace l3::parallel
