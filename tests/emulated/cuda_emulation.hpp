// Runs the CUDA backend's own kernels (kernels/cuda/*.cu) on the CPU, so that their index
// arithmetic, vector paths, tails, block reductions and barriers are tested on machines without a
// GPU. Force-included (-include) before a kernel file that tests/emulated/translate_cuda.cpp has
// rewritten into C++ (its `<<<...>>>` launches become l3emu::launch calls).
//
// What it models: a grid of blocks, each block's threads as cooperatively scheduled fibers in
// one OS thread, __syncthreads as a block barrier, __shfl_xor_sync as a warp exchange with a
// warp barrier on each side, __shared__ arrays (static: blocks run one after the other) and
// dynamic shared memory (fresh and NaN-filled for every block). Threads run in a shuffled order
// between barriers and blocks in a shuffled order, so a missing barrier or a dependence between
// blocks shows up as a wrong result. It is strict where CUDA leaves behaviour undefined: a
// __syncthreads that some threads of the block never reach (they exited or wait elsewhere), or a
// full-mask shuffle with exited lanes, is an error, and so is a pointer cast to a type whose
// alignment the address lacks (checked_cast below; a GPU faults on such an access). Device memory
// is host memory: run under AddressSanitizer, an out-of-bounds access is reported with the kernel
// on the stack.
//
// What it cannot model: the GPU's memory model and timing, bf16 hardware rounding in
// intrinsics (fp32 math here is the host's; __expf is expf), and anything in cuBLASLt, cuDNN or
// NCCL (nccl.cpp moves the data of NCCL's collectives over MPI instead). A kernel passing here
// still has to pass tests/gpu on a device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// The qualifiers of device code mean nothing on the host, except __shared__: one array per
// block, which `static` gives as long as blocks of one kernel run one after the other.
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace l3emu {

// The built-in variables of the emulated thread that is running.
struct ThreadState {
  uint3 thread_idx{};
  uint3 block_idx{};
  dim3 block_dim;
  dim3 grid_dim;
};

// The running emulated thread's state; throws outside a kernel.
ThreadState& current();

// Block barrier; warp exchange: every lane of the calling warp deposits `bytes` at once and
// receives lane `source_lane`'s deposit.
void syncthreads();
void warp_exchange(const void* value, void* result, std::size_t bytes, unsigned int mask,
                   int source_lane);

// The launch's dynamic shared memory (the third launch parameter), NaN-filled per block.
void* dynamic_shared_memory();

// Runs `thread_body` once per thread of every block. Throws std::runtime_error when a thread
// breaks a barrier rule or a thread body throws.
void run_grid(dim3 grid, dim3 block, std::size_t shared_bytes,
              const std::function<void()>& thread_body);

// Queues work on a stream (runtime.cpp): it runs when a synchronisation or a dependent stream
// needs it, never earlier.
void enqueue(cudaStream_t stream, std::function<void()> work);
// Whether streams also run queued work at random moments (the default) or only when it is
// needed (the latest moment CUDA allows); returns the previous setting. For tests that need one
// order.
bool set_random_progress(bool on);
// With random progress on: true or false at random (the emulation's other random choices, e.g.
// whether a nonblocking NCCL call finishes later); with it off: false.
bool random_choice();

struct LaunchConfig {
  dim3 grid;
  dim3 block;
  std::size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
};
inline LaunchConfig config(dim3 grid, dim3 block, std::size_t shared_bytes = 0,
                           cudaStream_t stream = nullptr) {
  return {grid, block, shared_bytes, stream};
}

// `kernel<<<cfg>>>(args)` becomes `launch(config(cfg), call-the-kernel)(args)`: the arguments
// are evaluated at the launch and copied into the queued work; every thread calls the kernel with
// its own copy (by value, like CUDA's parameters).
template <typename Call>
auto launch(LaunchConfig cfg, Call call) {
  return [cfg, call](const auto&... args) {
    enqueue(cfg.stream, [cfg, call, parameters = std::make_tuple(args...)] {
      run_grid(cfg.grid, cfg.block, cfg.shared_bytes, [&] { std::apply(call, parameters); });
    });
  };
}

template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_memory());
}

// Throws "misaligned address" naming the cast's place, the pointee's size and alignment.
[[noreturn]] void misaligned_cast(const char* file, int line, std::uintptr_t address,
                                  std::size_t size, std::size_t alignment);

// `reinterpret_cast` in a kernel file, as translated: a GPU loads and stores a type in one
// access of its alignment (16 bytes for Bf16x8 and float4) and faults on a misaligned address,
// which ends the CUDA context and every test after it; the host's loads do not care. So a pointer
// cast to a type whose alignment the address does not have is an error here, at the cast: a
// vector pointer is made only where the vector path's alignment test has passed. Casts to
// integers and references, and to void or byte pointers, pass through.
template <typename To, typename From>
To checked_cast(From&& from, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  if constexpr (std::is_pointer_v<To> && std::is_pointer_v<std::remove_cvref_t<From>>) {
    using Pointee = std::remove_cv_t<std::remove_pointer_t<To>>;
    if constexpr (!std::is_void_v<Pointee>) {
      const auto address = reinterpret_cast<std::uintptr_t>(from);
      if (address % alignof(Pointee) != 0) {
        misaligned_cast(file, line, address, sizeof(Pointee), alignof(Pointee));
      }
    }
  }
  return reinterpret_cast<To>(std::forward<From>(from));
}

}  // namespace l3emu

#define threadIdx (::l3emu::current().thread_idx)
#define blockIdx (::l3emu::current().block_idx)
#define blockDim (::l3emu::current().block_dim)
#define gridDim (::l3emu::current().grid_dim)

inline void __syncthreads() { l3emu::syncthreads(); }

template <typename T>
T __shfl_xor_sync(unsigned int mask, T value, int lane_mask) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16);
  T result;
  const int lane = static_cast<int>(::l3emu::current().thread_idx.x +
                                    ::l3emu::current().thread_idx.y * blockDim.x +
                                    ::l3emu::current().thread_idx.z * blockDim.x * blockDim.y) %
                   32;
  l3emu::warp_exchange(&value, &result, sizeof(T), mask, lane ^ lane_mask);
  return result;
}

// Device math the host lacks, with the host's accuracy.
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0F / std::sqrt(x); }
// A product rounded on its own (never contracted into an FMA; the host build has no FMA).
inline float __fmul_rn(float a, float b) { return a * b; }

// CUDA's global min/max (device overloads for every arithmetic type).
template <typename A, typename B>
constexpr std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <typename A, typename B>
constexpr std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}
