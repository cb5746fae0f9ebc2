#include "parallel/tensor_state.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace l3::parallel {

namespace {

// Where local layout position `offset` is in values laid out back to back over `ranges`.
class Positions {
 public:
  explicit Positions(const std::vector<model::FlatRange>& ranges) : ranges_(ranges) {
    std::int64_t at = 0;
    for (const model::FlatRange& r : ranges_) {
      starts_.push_back(at);
      at += r.size();
    }
  }
  [[nodiscard]] std::int64_t of(std::int64_t offset) const {
    const auto it =
        std::upper_bound(ranges_.begin(), ranges_.end(), offset,
                         [](std::int64_t o, const model::FlatRange& r) { return o < r.begin; });
    if (it == ranges_.begin()) throw core::internal_error("tensor state: a piece outside ranges");
    const auto i = static_cast<std::size_t>(it - ranges_.begin() - 1);
    return starts_[i] + offset - ranges_[i].begin;
  }

 private:
  const std::vector<model::FlatRange>& ranges_;
  std::vector<std::int64_t> starts_;
};

}  // namespace

TensorStateMap::TensorStateMap(model::ParameterLayout whole, const model::ParameterLayout& local,
                               model::TensorSlice slice)
    : whole_(std::move(whole)), slice_(slice), runs_(model::slice_runs(whole_, local, slice)) {
  // slice_runs lists them tensor by tensor in local order; a tensor whose shape is the whole's
  // is replicated.
  for (const model::TensorInfo& t : local.tensors()) {
    const bool replicated = whole_.find(t.name).shape == t.shape;
    const std::int64_t count =
        replicated || t.shape.size() < 2 || t.shape[1] == whole_.find(t.name).shape[1] ? 1
                                                                                       : t.shape[0];
    replicated_.insert(replicated_.end(), static_cast<std::size_t>(count), replicated);
  }
  if (replicated_.size() != runs_.size()) throw core::internal_error("tensor state: runs");
}

std::vector<model::FlatRange> TensorStateMap::replicated() const {
  std::vector<model::FlatRange> out;
  for (std::size_t i = 0; i < runs_.size(); ++i) {
    if (replicated_[i])
      out.push_back({runs_[i].local_offset, runs_[i].local_offset + runs_[i].length});
  }
  return out;
}

std::vector<model::SliceRun> TensorStateMap::pieces(const std::vector<model::FlatRange>& ranges,
                                                    bool once) const {
  std::vector<model::SliceRun> out;
  for (std::size_t i = 0; i < runs_.size(); ++i) {
    if (once && replicated_[i] && slice_.rank != 0) continue;
    const model::SliceRun& run = runs_[i];
    const std::int64_t run_end = run.local_offset + run.length;
    // the ranges overlapping [local_offset, run_end)
    auto it = std::upper_bound(ranges.begin(), ranges.end(), run.local_offset,
                               [](std::int64_t o, const model::FlatRange& r) { return o < r.end; });
    for (; it != ranges.end() && it->begin < run_end; ++it) {
      const std::int64_t begin = std::max(it->begin, run.local_offset);
      const std::int64_t end = std::min(it->end, run_end);
      if (end <= begin) continue;
      out.push_back({.whole_offset = run.whole_offset + (begin - run.local_offset),
                     .local_offset = begin,
                     .length = end - begin});
    }
  }
  std::sort(out.begin(), out.end(), [](const model::SliceRun& a, const model::SliceRun& b) {
    return a.whole_offset < b.whole_offset;
  });
  return out;
}

std::vector<model::FlatRange> TensorStateMap::whole_ranges(
    const std::vector<model::SliceRun>& pieces) {
  std::vector<model::FlatRange> out;
  for (const model::SliceRun& p : pieces) {
    if (!out.empty() && out.back().end == p.whole_offset) {
      out.back().end += p.length;
    } else {
      out.push_back({p.whole_offset, p.whole_offset + p.length});
    }
  }
  return out;
}

ckpt::RankState TensorStateMap::to_whole(const ckpt::RankState& local) const {
  const std::vector<model::SliceRun> p = pieces(local.ranges, true);
  ckpt::RankState whole;
  whole.allocate(whole_ranges(p));
  const Positions from(local.ranges);
  std::int64_t at = 0;
  for (const model::SliceRun& piece : p) {
    const std::int64_t source = from.of(piece.local_offset);
    for (auto [in, out] :
         {std::pair{&local.master, &whole.master}, std::pair{&local.exp_avg, &whole.exp_avg},
          std::pair{&local.exp_avg_sq, &whole.exp_avg_sq}}) {
      std::copy_n(in->begin() + source, piece.length, out->begin() + at);
    }
    at += piece.length;
  }
  return whole;
}

std::vector<float> TensorStateMap::scatter_values(const std::vector<model::FlatRange>& ranges,
                                                  const std::vector<model::SliceRun>& pieces,
                                                  const std::vector<float>& whole_values) const {
  std::int64_t total = 0;
  for (const model::FlatRange& r : ranges) total += r.size();
  std::vector<float> out(static_cast<std::size_t>(total), 0.0F);
  const Positions to(ranges);
  std::int64_t at = 0;
  for (const model::SliceRun& piece : pieces) {
    std::copy_n(whole_values.begin() + at, piece.length, out.begin() + to.of(piece.local_offset));
    at += piece.length;
  }
  if (at != static_cast<std::int64_t>(whole_values.size()))
    throw core::internal_error("tensor state: values and pieces differ");
  return out;
}

ckpt::RankState TensorStateMap::scatter(const std::vector<model::FlatRange>& ranges,
                                        const std::vector<model::SliceRun>& pieces,
                                        const ckpt::RankState& whole) const {
  ckpt::RankState local;
  local.ranges = ranges;
  local.master = scatter_values(ranges, pieces, whole.master);
  local.exp_avg = scatter_values(ranges, pieces, whole.exp_avg);
  local.exp_avg_sq = scatter_values(ranges, pieces, whole.exp_avg_sq);
  return local;
}

}  // namespace l3::parallel
