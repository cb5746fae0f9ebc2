// How data parallelism moves a bucket of the flat gradient or weight buffer between ranks.
//
//   MpiExchange  - MPI on host memory: in place on the CPU backend; from a GPU through host
//                  staging buffers (gradients summed in fp32 there, rounded once on the way
//                  back). Works wherever MPI does, including several ranks sharing one GPU.
//   NcclExchange - NCCL on the GPU's own buffers, queued on a communication stream that waits
//                  for the compute stream with events (cuda/nccl_exchange.hpp).
//
// A bucket is a contiguous FlatRange of the flat buffer; pieces[r] is the part of it rank r owns,
// ascending and tiling the bucket (DataParallel::piece).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dist/communicator.hpp"
#include "dist/world.hpp"
#include "kernels/ops.hpp"
#include "model/parameter_layout.hpp"
#include "parallel/exchange_choice.hpp"

namespace l3::parallel {

using model::FlatRange;  // [begin, end) of the flat buffers (model/parameter_layout.hpp)

class GradientExchange {
 public:
  GradientExchange() = default;
  virtual ~GradientExchange() = default;
  GradientExchange(const GradientExchange&) = delete;
  GradientExchange& operator=(const GradientExchange&) = delete;
  GradientExchange(GradientExchange&&) = delete;
  GradientExchange& operator=(GradientExchange&&) = delete;

  [[nodiscard]] virtual std::string_view name() const noexcept = 0;

  // true: calls return once the work is queued behind what the backend has queued so far
  // (a stream), so they may be made from the backward pass's gradient hook; join() orders the
  // backend's later work after them. false: calls do the work before they return, on buffers
  // that must already be complete; they may run on a thread of their own when
  // host_thread_safe() (host memory, nothing shared with the training thread).
  [[nodiscard]] virtual bool queued() const noexcept = 0;
  [[nodiscard]] virtual bool host_thread_safe() const noexcept = 0;
  // The exchange prefers pieces of equal size (NCCL's reduce-scatter and all-gather).
  [[nodiscard]] virtual bool prefers_even_pieces() const noexcept { return false; }

  // On rank r: values[pieces[r]] = sum over ranks of their values[pieces[r]]. The rest of
  // the bucket is left as it was. values: the flat buffer (f32, or the compute dtype).
  virtual void reduce_scatter(kernels::TensorView values, FlatRange bucket,
                              std::span<const FlatRange> pieces) = 0;
  // Every rank's values[pieces[r]] to every rank, in place.
  virtual void all_gather(kernels::TensorView values, FlatRange bucket,
                          std::span<const FlatRange> pieces) = 0;
  // values[range] = sum over ranks of their values[range], in place (hybrid sharding: the
  // replicas of a piece add up their reduced gradients). The same range size on every rank.
  virtual void all_reduce(kernels::TensorView values, FlatRange range) = 0;
  // Orders the backend's later work after every exchange call so far (queued exchanges).
  virtual void join() = 0;
  // Queued exchanges: a ticket for the calls made so far, and later backend work ordered after
  // just those calls (the last kTickets tickets stay valid). Others: 0, and nothing to order.
  static constexpr int kTickets = 8;
  virtual std::uint64_t mark() { return 0; }
  virtual void join_ticket(std::uint64_t ticket) { (void)ticket; }

  // An exchange of the same kind over another communicator whose calls are ordered after this
  // one's earlier calls: queued on the same stream (NCCL), or made on the same thread (MPI).
  // Hybrid sharding adds up the shard groups' reduced pieces with it right behind their
  // reduce-scatter. Collective over `world`; this exchange must outlive it.
  [[nodiscard]] virtual std::unique_ptr<GradientExchange> follower(const dist::World& world) = 0;
};

class MpiExchange final : public GradientExchange {
 public:
  // Collective over `world` (duplicates its communicator). staged: the buffers are in the
  // backend's memory, not the host's, and travel through host staging buffers (ops.copy).
  MpiExchange(const dist::World& world, kernels::Ops& ops, bool staged);

  [[nodiscard]] std::string_view name() const noexcept override {
    return staged_ ? "mpi (staged through host memory)" : "mpi";
  }
  [[nodiscard]] bool queued() const noexcept override { return false; }
  [[nodiscard]] bool host_thread_safe() const noexcept override { return !staged_; }
  void reduce_scatter(kernels::TensorView values, FlatRange bucket,
                      std::span<const FlatRange> pieces) override;
  void all_gather(kernels::TensorView values, FlatRange bucket,
                  std::span<const FlatRange> pieces) override;
  void all_reduce(kernels::TensorView values, FlatRange range) override;
  void join() override {}
  [[nodiscard]] std::unique_ptr<GradientExchange> follower(const dist::World& world) override {
    return std::make_unique<MpiExchange>(world, ops_, staged_);
  }

 private:
  kernels::Ops& ops_;
  dist::UniqueComm comm_;
  int rank_ = 0;
  bool staged_ = false;
  std::vector<float> bucket_f32_;         // staged reduce: the bucket widened to fp32
  std::vector<float> piece_f32_;          // the reduced piece
  std::vector<std::uint8_t> gather_raw_;  // staged gather: the bucket in its own dtype
};

// The exchange for a run (run_choices.hpp). usage Error for NCCL on a CPU backend, in a build
// without it, or where ranks of a node share a GPU. Collective over `world`.
[[nodiscard]] std::unique_ptr<GradientExchange> make_gradient_exchange(const dist::World& world,
                                                                       kernels::Ops& ops,
                                                                       ExchangeChoice choice);

}  // namespace l3::parallel
