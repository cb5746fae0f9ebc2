#include "model/tensor_slice.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace l3::model {

void check_tensor_parallel(const ModelConfig& whole, int ranks) {
  if (ranks < 1) throw core::usage_error(fmt::format("--tensor-parallel {}: must be >= 1", ranks));
  const auto divides = [&](std::int64_t count, std::string_view what) {
    if (count % ranks != 0) {
      throw core::usage_error(
          fmt::format("--tensor-parallel {}: {} has {} {}, which do not divide into {} equal parts",
                      ranks, whole.name, count, what, ranks));
    }
  };
  divides(whole.n_heads, "attention heads");
  divides(whole.n_kv_heads, "key/value heads");
  divides(whole.intermediate_size, "MLP columns (intermediate_size)");
  divides(whole.vocab_size, "vocabulary ids");
}

ModelConfig slice_config(const ModelConfig& whole, int ranks) {
  check_tensor_parallel(whole, ranks);
  ModelConfig local = whole;
  local.n_heads = whole.n_heads / ranks;
  local.n_kv_heads = whole.n_kv_heads / ranks;
  local.intermediate_size = whole.intermediate_size / ranks;
  local.vocab_size = whole.vocab_size / ranks;
  local.tensor_slices = whole.tensor_slices * ranks;
  return local;
}

std::vector<SliceRun> slice_runs(const ParameterLayout& whole, const ParameterLayout& local,
                                 TensorSlice slice) {
  std::vector<SliceRun> runs;
  for (const TensorInfo& mine : local.tensors()) {
    const TensorInfo& all = whole.find(mine.name);
    const bool same = mine.shape == all.shape;
    if (same || (mine.shape.size() == 2 && mine.shape[1] == all.shape[1])) {
      // whole (a norm, the score head), or a block of rows (column-parallel, the vocabulary)
      const std::int64_t first = same ? 0 : slice.rank * mine.numel;
      runs.push_back({all.offset + first, mine.offset, mine.numel});
      continue;
    }
    // a block of columns of every row (row-parallel: o_proj, down_proj)
    const std::int64_t cols = mine.shape[1];
    for (std::int64_t row = 0; row < mine.shape[0]; ++row) {
      runs.push_back(
          {all.offset + row * all.shape[1] + slice.rank * cols, mine.offset + row * cols, cols});
    }
  }
  return runs;
}

void take_slice(std::span<const SliceRun> runs, std::span<const float> whole,
                std::span<float> local) {
  for (const SliceRun& r : runs) {
    std::copy_n(
        whole.subspan(static_cast<std::size_t>(r.whole_offset), static_cast<std::size_t>(r.length))
            .begin(),
        r.length, local.subspan(static_cast<std::size_t>(r.local_offset)).begin());
  }
}

void put_slice(std::span<const SliceRun> runs, std::span<const float> local,
               std::span<float> whole) {
  for (const SliceRun& r : runs) {
    std::copy_n(
        local.subspan(static_cast<std::size_t>(r.local_offset), static_cast<std::size_t>(r.length))
            .begin(),
        r.length, whole.subspan(static_cast<std::size_t>(r.whole_offset)).begin());
  }
}

}  // namespace l3::model
