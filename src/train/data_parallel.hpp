// Data parallelism over the ranks of a World, with a ZeRO-1 sharded optimizer.
//
// The flat gradient buffer is cut into buckets (contiguous ranges, the last one first because
// the backward pass finishes the gradients from the end of the layout to its start). Each
// bucket is split into one piece per rank. During the backward pass of a step's last
// micro-batch, each bucket whose gradients are complete is handed to a communication thread
// that reduce-scatters it: rank r receives the global sum of piece r. Reduction of the late
// layers thus overlaps the backward of the early ones.
//
// ZeRO-1 (shard_optimizer): rank r owns the AdamW state of its pieces only (1/W of the
// optimizer memory), updates them, and the updated parameters are all-gathered bucket by
// bucket. Without sharding, the reduced pieces are all-gathered instead and every rank runs
// AdamW on the whole buffer. Both give bit-identical weights: the same reduced gradients, the
// same elementwise update, and a gradient norm summed piece by piece in a fixed order (not in
// MPI's order), so it does not depend on how the work was split either.
//
// Pieces and buckets start at multiples of ParameterLayout::kAlignment elements, so every
// element is updated by the same vector code path whatever the number of ranks.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "dist/unique_comm.hpp"
#include "dist/world.hpp"
#include "kernels/ops.hpp"
#include "model/parameter_layout.hpp"
#include "train/adamw_optimizer.hpp"

namespace l3::train {

struct DataParallelConfig {
  std::int64_t bucket_elements = std::int64_t{8} << 20;  // 32 MiB of fp32 gradients
  bool shard_optimizer = true;                           // ZeRO-1
  bool overlap = true;  // reduce on a communication thread during the backward pass
};

// A range [begin, end) of the flat buffers.
struct Range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  [[nodiscard]] std::int64_t size() const noexcept { return end - begin; }
};

struct ReductionTimes {
  double wait_seconds = 0;    // the training thread blocked waiting for reductions
  double reduce_seconds = 0;  // time spent in reduce-scatter (and gradient all-gather)
  double gather_seconds = 0;  // parameter all-gather after the update
};

class DataParallel {
 public:
  // Collective over `world` (duplicates its communicator for the communication thread).
  DataParallel(const dist::World& world, kernels::Ops& ops, const model::ParameterLayout& layout,
               DataParallelConfig config, AdamWConfig adamw);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  DataParallel(DataParallel&&) = delete;
  DataParallel& operator=(DataParallel&&) = delete;

  // One step: begin_step before the last micro-batch's backward, gradients_ready from the
  // model's hook during it (any thread that runs the backward), finish_reduction after it.
  void begin_step(kernels::TensorView grads);
  void gradients_ready(std::int64_t offset);
  void finish_reduction();

  // sqrt(sum g^2) of the reduced gradients. Collective; the same value on every rank.
  [[nodiscard]] double gradient_norm();
  // AdamW on this rank's share with the gradients scaled by grad_scale (clipping), then the
  // parameters all-gathered (ZeRO-1). master / weight_copy as in AdamW::step.
  void update(kernels::TensorView master, kernels::TensorView weight_copy, float lr,
              float grad_scale);

  // All-gathers the parameters from their owners (after update(), or after each rank loaded
  // its pieces from a checkpoint). Nothing to do on one rank or without sharding.
  void gather_parameters(kernels::TensorView master);

  // Checkpoints: the ranges this rank writes (its pieces, ascending; sharded or not, so that
  // every value is written once), and the ranges whose state it must hold (its pieces when
  // sharded, the whole buffer otherwise).
  [[nodiscard]] std::vector<Range> write_ranges() const;
  [[nodiscard]] std::vector<Range> state_ranges() const;
  // The AdamW moments of `ranges` (within state_ranges()) to / from host arrays holding the
  // ranges back to back; and the update count of every optimizer.
  void save_moments(const std::vector<Range>& ranges, std::span<float> m, std::span<float> v);
  void load_moments(const std::vector<Range>& ranges, std::span<const float> m,
                    std::span<const float> v);
  [[nodiscard]] std::int64_t adamw_steps() const noexcept;
  void set_adamw_steps(std::int64_t steps) noexcept;

  [[nodiscard]] const std::vector<Range>& buckets() const noexcept { return buckets_; }
  // Piece r of bucket b: what rank r owns of it.
  [[nodiscard]] Range piece(std::size_t bucket, int rank) const;
  // The optimizers of this rank: one per owned piece (ZeRO-1) or one for the whole buffer.
  [[nodiscard]] std::vector<AdamW>& optimizers() noexcept { return optimizers_; }
  [[nodiscard]] bool sharded() const noexcept { return config_.shard_optimizer; }
  [[nodiscard]] bool overlapping() const noexcept { return overlap_; }
  // Times of the last step.
  [[nodiscard]] const ReductionTimes& times() const noexcept { return times_; }

 private:
  void reduce_bucket(std::size_t bucket);
  // The optimizer holding flat position `begin` and the offset of `begin` in its moments.
  [[nodiscard]] std::pair<AdamW*, std::int64_t> optimizer_at(std::int64_t begin);
  void launch_until(std::int64_t offset);  // queue every bucket starting at or after offset
  void worker_loop();

  const dist::World& world_;
  kernels::Ops& ops_;
  const model::ParameterLayout& layout_;
  DataParallelConfig config_;
  int size_;
  int rank_;
  std::vector<Range> buckets_;  // in layout order
  std::vector<AdamW> optimizers_;
  std::vector<float> scratch_;  // the received piece of a bucket
  kernels::TensorView grads_;
  ReductionTimes times_;

  // The communication thread and its queue of buckets (launched from the last to the first).
  bool overlap_ = false;
  dist::UniqueComm comm_;  // the reductions' own communicator
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::size_t> queue_;
  std::size_t next_launch_ = 0;  // buckets not launched yet: [0, buckets_.size() - next_launch_)
  std::size_t done_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::thread worker_;
};

}  // namespace l3::train
