// What one rank saves and restores: its ranges of the flat parameter layout (its ZeRO-1 pieces)
// with the fp32 master weights and the AdamW moments of those ranges, as host copies. A
// checkpoint holds the full logical tensors, so the ranges of a restart may differ from those
// of the run that wrote it (another number of ranks).
#pragma once

#include <cstdint>
#include <vector>

#include "model/parameter_layout.hpp"

namespace l3::ckpt {

struct RankState {
  std::vector<model::FlatRange> ranges;  // disjoint, ascending
  std::vector<float> master;             // the ranges' values back to back
  std::vector<float> exp_avg;            // AdamW first moment, same positions
  std::vector<float> exp_avg_sq;         // second moment

  [[nodiscard]] std::int64_t values() const noexcept;
  // Sizes the three arrays for `ranges` (contents unspecified when reused).
  void allocate(std::vector<model::FlatRange> owned);
};

// The part of `state` over `ranges` (each within one of state's ranges), copied.
[[nodiscard]] RankState restrict_state(const RankState& state,
                                       const std::vector<model::FlatRange>& ranges);

// A contiguous run of one tensor's elements inside a rank's ranges.
struct TensorSlice {
  std::size_t tensor = 0;  // index into layout.tensors()
  std::int64_t first = 0;  // element offset within the tensor (row-major)
  std::int64_t count = 0;
  std::int64_t position = 0;  // where it sits in RankState's arrays
};

// The slices of every tensor that the ranges cover (alignment padding is skipped), in
// ascending flat order.
[[nodiscard]] std::vector<TensorSlice> tensor_slices(const model::ParameterLayout& layout,
                                                     const std::vector<model::FlatRange>& ranges);

// Evenly spaced slices of one tensor with the same count, back to back in RankState's arrays:
// `rows` runs of `count` elements, the r-th at element first + r * stride. A tensor-parallel
// rank holds a row-parallel weight (o_proj, down_proj) as one run per row; as one block its
// checkpoint slice is one manifest entry, not one per row (at 405B: 16,384 rows per tensor).
struct TensorBlock {
  std::size_t tensor = 0;
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t rows = 1;
  std::int64_t stride = 0;    // count where rows == 1
  std::int64_t position = 0;  // the first run's place in RankState's arrays; the rest follow

  [[nodiscard]] std::int64_t values() const noexcept { return count * rows; }
};

// tensor_slices merged into blocks (a slice that continues the block before it joins it).
[[nodiscard]] std::vector<TensorBlock> tensor_blocks(const model::ParameterLayout& layout,
                                                     const std::vector<model::FlatRange>& ranges);

}  // namespace l3::ckpt
