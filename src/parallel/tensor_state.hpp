// A tensor-parallel rank's values in the whole model's layout (--tensor-parallel T): what
// checkpoints store and initial weights are read as, so that neither depends on T. A rank's
// state lives in its slice's layout (model/tensor_slice.hpp); its ranges there map onto pieces
// of the whole layout (the column-parallel tensors' blocks of rows, one piece per row of the
// row-parallel ones, the replicated norms whole).
#pragma once

#include <cstdint>
#include <vector>

#include "ckpt/rank_state.hpp"
#include "model/parameter_layout.hpp"
#include "model/tensor_slice.hpp"

namespace l3::parallel {

class TensorStateMap {
 public:
  // `local`: the layout of `whole` sliced for `slice` (LlamaModel::layout() of a sliced model).
  TensorStateMap(model::ParameterLayout whole, const model::ParameterLayout& local,
                 model::TensorSlice slice);

  [[nodiscard]] const model::ParameterLayout& whole() const noexcept { return whole_; }
  [[nodiscard]] const model::TensorSlice& slice() const noexcept { return slice_; }

  // The local layout's ranges of the replicated tensors (the norms, a reward model's score
  // head), ascending.
  [[nodiscard]] std::vector<model::FlatRange> replicated() const;
  // The pieces of the local `ranges` (ascending, disjoint) in the whole layout, ascending by
  // their whole offset. once: without the replicated tensors on tensor ranks other than 0, so
  // that the group's pieces cover the whole layout exactly once (what a checkpoint writes).
  [[nodiscard]] std::vector<model::SliceRun> pieces(const std::vector<model::FlatRange>& ranges,
                                                    bool once) const;
  // The whole layout's ranges those pieces cover (adjacent ones merged), in their order.
  [[nodiscard]] static std::vector<model::FlatRange> whole_ranges(
      const std::vector<model::SliceRun>& pieces);

  // A rank's state over local ranges, as the state of the whole layout's ranges it writes
  // (replicated tensors: tensor rank 0 only).
  [[nodiscard]] ckpt::RankState to_whole(const ckpt::RankState& local) const;
  // The state of the local `ranges`, from what `read` returns for the whole layout's ranges
  // their pieces cover (ckpt::read_rank_state of a checkpoint).
  template <typename Read>
  [[nodiscard]] ckpt::RankState to_local(const std::vector<model::FlatRange>& ranges,
                                         const Read& read) const {
    const std::vector<model::SliceRun> p = pieces(ranges, false);
    return scatter(ranges, p, read(whole_ranges(p)));
  }
  // Values at the local `ranges` (back to back; padding 0) from values at the whole ranges
  // of their pieces (back to back, in the pieces' order).
  [[nodiscard]] std::vector<float> scatter_values(const std::vector<model::FlatRange>& ranges,
                                                  const std::vector<model::SliceRun>& pieces,
                                                  const std::vector<float>& whole_values) const;

 private:
  [[nodiscard]] ckpt::RankState scatter(const std::vector<model::FlatRange>& ranges,
                                        const std::vector<model::SliceRun>& pieces,
                                        const ckpt::RankState& whole) const;

  model::ParameterLayout whole_;
  model::TensorSlice slice_;
  std::vector<model::SliceRun> runs_;  // the whole slice, ascending by local offset
  std::vector<bool> replicated_;       // per run: a tensor every rank holds whole
};

}  // namespace l3::parallel
