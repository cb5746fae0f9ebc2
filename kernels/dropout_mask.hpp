// The dropout mask every backend draws (Ops::dropout): element i of a call with `seed` is kept
// when a 24-bit uniform hashed from (seed, i) is at least p. Integer arithmetic only, so that the
// CPU, the GPU and the CPU emulation of the GPU keep exactly the same elements, and a backward
// pass (or a recomputed forward) regenerates the forward's mask from the seed alone.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define L3_HOST_DEVICE __host__ __device__
#else
#define L3_HOST_DEVICE
#endif

namespace l3::kernels {

// SplitMix64's finaliser of seed + i * golden ratio: consecutive elements get independent bits.
L3_HOST_DEVICE inline std::uint64_t dropout_hash(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = seed + (i + 1U) * 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30U)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27U)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31U);
}

// p as the 24-bit threshold the hash is compared with: keep when hash >> 40 >= threshold.
L3_HOST_DEVICE inline std::uint32_t dropout_threshold(float p) {
  return static_cast<std::uint32_t>(static_cast<double>(p) * 16777216.0);
}

L3_HOST_DEVICE inline bool dropout_keep(std::uint64_t seed, std::uint64_t i,
                                        std::uint32_t threshold) {
  return static_cast<std::uint32_t>(dropout_hash(seed, i) >> 40U) >= threshold;
}

}  // namespace l3::kernels
