// Host models of the three CUB device algorithms the CUDA backend calls (embedding.cu), for the
// emulated kernel tests: same signatures, the same two-call protocol (a null temporary buffer
// asks for its size; a smaller buffer than asked is an error), the same results (the radix sort
// is stable and orders signed keys numerically). Not CUB: only what these calls promise.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

namespace cub {

namespace detail {
inline constexpr std::size_t kTemporaryBytes = 256;  // asked for, checked, not used
inline bool size_query(void* temporary, std::size_t& bytes) {
  if (temporary != nullptr) return false;
  bytes = kTemporaryBytes;
  return true;
}
}  // namespace detail

struct DeviceRadixSort {
  template <typename Key, typename Value>
  static cudaError_t SortPairs(void* temporary, std::size_t& bytes, const Key* keys_in,
                               Key* keys_out, const Value* values_in, Value* values_out, int n,
                               int begin_bit = 0, int end_bit = static_cast<int>(sizeof(Key) * 8),
                               cudaStream_t /*stream*/ = nullptr) {
    if (detail::size_query(temporary, bytes)) return cudaSuccess;
    if (bytes < detail::kTemporaryBytes || n < 0) return cudaErrorInvalidValue;
    if (begin_bit != 0 || end_bit != static_cast<int>(sizeof(Key) * 8)) {
      return cudaErrorNotSupported;  // partial-bit sorts are not modelled
    }
    std::vector<int> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return keys_in[a] < keys_in[b]; });
    for (int i = 0; i < n; ++i) {
      keys_out[i] = keys_in[order[static_cast<std::size_t>(i)]];
      values_out[i] = values_in[order[static_cast<std::size_t>(i)]];
    }
    return cudaSuccess;
  }
};

struct DeviceRunLengthEncode {
  template <typename T, typename Count, typename Runs>
  static cudaError_t Encode(void* temporary, std::size_t& bytes, const T* in, T* unique_out,
                            Count* counts_out, Runs* runs_out, int n,
                            cudaStream_t /*stream*/ = nullptr) {
    if (detail::size_query(temporary, bytes)) return cudaSuccess;
    if (bytes < detail::kTemporaryBytes || n < 0) return cudaErrorInvalidValue;
    Runs runs = 0;
    for (int i = 0; i < n; ++i) {
      if (i == 0 || !(in[i] == in[i - 1])) {
        unique_out[runs] = in[i];
        counts_out[runs] = 0;
        ++runs;
      }
      ++counts_out[runs - 1];
    }
    *runs_out = runs;
    return cudaSuccess;
  }
};

struct DeviceScan {
  template <typename In, typename Out>
  static cudaError_t ExclusiveSum(void* temporary, std::size_t& bytes, const In* in, Out* out,
                                  int n, cudaStream_t /*stream*/ = nullptr) {
    if (detail::size_query(temporary, bytes)) return cudaSuccess;
    if (bytes < detail::kTemporaryBytes || n < 0) return cudaErrorInvalidValue;
    Out sum{};
    for (int i = 0; i < n; ++i) {
      const Out value = static_cast<Out>(in[i]);  // read before writing: in and out may alias
      out[i] = sum;
      sum += value;
    }
    return cudaSuccess;
  }
};

}  // namespace cub
