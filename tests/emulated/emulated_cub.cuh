// Host models of the three CUB device algorithms the CUDA backend calls (embedding.cu), for the
// emulated kernel tests: same signatures, the same two-call protocol (a null temporary buffer
// asks for its size; a smaller buffer than asked is an error), the same results (the radix sort
// is stable and orders signed keys numerically), queued on the stream like any device work.
// Not CUB: only what these calls promise.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cuda_emulation.hpp"

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
                               cudaStream_t stream = nullptr) {
    if (detail::size_query(temporary, bytes)) return cudaSuccess;
    if (bytes < detail::kTemporaryBytes || n < 0) return cudaErrorInvalidValue;
    if (begin_bit != 0 || end_bit != static_cast<int>(sizeof(Key) * 8)) {
      return cudaErrorNotSupported;  // partial-bit sorts are not modelled
    }
    l3emu::enqueue(stream, [=] { sort(keys_in, keys_out, values_in, values_out, n); });
    return cudaSuccess;
  }

 private:
  template <typename Key, typename Value>
  static void sort(const Key* keys_in, Key* keys_out, const Value* values_in, Value* values_out,
                   int n) {
    std::vector<int> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return keys_in[a] < keys_in[b]; });
    for (int i = 0; i < n; ++i) {
      keys_out[i] = keys_in[order[static_cast<std::size_t>(i)]];
      values_out[i] = values_in[order[static_cast<std::size_t>(i)]];
    }
  }
};

struct DeviceRunLengthEncode {
  template <typename T, typename Count, typename Runs>
  static cudaError_t Encode(void* temporary, std::size_t& bytes, const T* in, T* unique_out,
                            Count* counts_out, Runs* runs_out, int n,
                            cudaStream_t stream = nullptr) {
    if (detail::size_query(temporary, bytes)) return cudaSuccess;
    if (bytes < detail::kTemporaryBytes || n < 0) return cudaErrorInvalidValue;
    l3emu::enqueue(stream, [=] { encode(in, unique_out, counts_out, runs_out, n); });
    return cudaSuccess;
  }

 private:
  template <typename T, typename Count, typename Runs>
  static void encode(const T* in, T* unique_out, Count* counts_out, Runs* runs_out, int n) {
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
  }
};

struct DeviceScan {
  template <typename In, typename Out>
  static cudaError_t ExclusiveSum(void* temporary, std::size_t& bytes, const In* in, Out* out,
                                  int n, cudaStream_t stream = nullptr) {
    if (detail::size_query(temporary, bytes)) return cudaSuccess;
    if (bytes < detail::kTemporaryBytes || n < 0) return cudaErrorInvalidValue;
    l3emu::enqueue(stream, [=] { scan(in, out, n); });
    return cudaSuccess;
  }

 private:
  template <typename In, typename Out>
  static void scan(const In* in, Out* out, int n) {
    // Wrapping sums, as on the device: entries past the meaningful ones may hold anything.
    using Wrapping = std::make_unsigned_t<Out>;
    Wrapping sum = 0;
    for (int i = 0; i < n; ++i) {
      const auto value = static_cast<Wrapping>(in[i]);  // read before writing: in and out alias
      out[i] = static_cast<Out>(sum);
      sum += value;
    }
  }
};

}  // namespace cub
