#include "ckpt/rank_state.hpp"

#include <algorithm>
#include <stdexcept>

namespace l3::ckpt {

std::int64_t RankState::values() const noexcept {
  std::int64_t n = 0;
  for (const model::FlatRange& r : ranges) n += r.size();
  return n;
}

void RankState::allocate(std::vector<model::FlatRange> owned) {
  ranges = std::move(owned);
  const auto n = static_cast<std::size_t>(values());
  // resize, not assign: a recycled snapshot of the same size is neither refilled nor
  // reallocated (first-touch page faults cost more than the copy itself).
  master.resize(n);
  exp_avg.resize(n);
  exp_avg_sq.resize(n);
}

RankState restrict_state(const RankState& state, const std::vector<model::FlatRange>& ranges) {
  RankState out;
  out.allocate(ranges);
  std::int64_t to = 0;
  for (const model::FlatRange& want : ranges) {
    std::int64_t from = 0;
    bool found = false;
    for (const model::FlatRange& have : state.ranges) {
      if (want.begin >= have.begin && want.end <= have.end) {
        from += want.begin - have.begin;
        found = true;
        break;
      }
      from += have.size();
    }
    if (!found) throw std::out_of_range("restrict_state: a range outside the state");
    const auto n = static_cast<std::size_t>(want.size());
    std::copy_n(state.master.begin() + from, n, out.master.begin() + to);
    std::copy_n(state.exp_avg.begin() + from, n, out.exp_avg.begin() + to);
    std::copy_n(state.exp_avg_sq.begin() + from, n, out.exp_avg_sq.begin() + to);
    to += want.size();
  }
  return out;
}

std::vector<TensorSlice> tensor_slices(const model::ParameterLayout& layout,
                                       const std::vector<model::FlatRange>& ranges) {
  std::vector<TensorSlice> slices;
  std::int64_t position = 0;
  for (const model::FlatRange& r : ranges) {
    for (std::size_t t = 0; t < layout.tensors().size(); ++t) {
      const model::TensorInfo& info = layout.tensors()[t];
      const std::int64_t lo = std::max(r.begin, info.offset);
      const std::int64_t hi = std::min(r.end, info.offset + info.numel);
      if (lo >= hi) continue;
      slices.push_back({t, lo - info.offset, hi - lo, position + (lo - r.begin)});
    }
    position += r.size();
  }
  return slices;
}

}  // namespace l3::ckpt
