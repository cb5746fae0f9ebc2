// Deterministic OpenMP helpers: the same inputs and thread count give bitwise the same result
// (reductions combine per-thread partial sums in thread order, never in arrival order), which
// restart-equals-uninterrupted and recompute-equals-stored rely on.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace l3::kernels::cpu {

// The contiguous share [begin, end) of n items that thread `thread` of `threads` owns.
struct Range {
  std::int64_t begin;
  std::int64_t end;
};
[[nodiscard]] inline Range static_share(std::int64_t n, int thread, int threads) noexcept {
  const std::int64_t base = n / threads;
  const std::int64_t extra = n % threads;
  const std::int64_t begin = thread * base + std::min<std::int64_t>(thread, extra);
  return {begin, begin + base + (thread < extra ? 1 : 0)};
}

// sum over threads (in thread order) of partial(begin, end), each thread taking a static share.
template <typename Partial>
[[nodiscard]] double deterministic_sum(std::int64_t n, Partial&& partial) {
  const int threads = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(n)));
  std::vector<double> partials(static_cast<std::size_t>(threads), 0.0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const Range r = static_share(n, t, omp_get_num_threads());
    partials[static_cast<std::size_t>(t)] = partial(r.begin, r.end);
  }
  double total = 0.0;
  for (const double p : partials) total += p;
  return total;
}

}  // namespace l3::kernels::cpu
