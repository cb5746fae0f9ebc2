// Named ranges on the timeline of a profiler (NVIDIA Nsight Systems / Compute through NVTX, in
// builds with the CUDA backend), around every layer and phase of a step, so that a profile reads
// as "step 12 > micro-batch 0 > block 7 backward > ...". Without a profiler attached an NVTX call
// is a check of one function pointer; without CUDA the ranges compile to nothing.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string_view>
#include <utility>

#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#define L3_HAVE_NVTX 1
#endif

namespace l3::core {

class TraceRange {
 public:
  // The name is copied (NVTX copies it too), so a temporary is fine.
  explicit TraceRange(std::string_view name) noexcept { push(name); }
  // fmt-formatted name, cut at 63 characters.
  template <typename... Args>
  TraceRange(fmt::format_string<Args...> format, Args&&... args) noexcept {
#if defined(L3_HAVE_NVTX)
    std::array<char, 64> name{};
    std::size_t length = 0;
    try {
      length =
          fmt::format_to_n(name.data(), name.size() - 1, format, std::forward<Args>(args)...).size;
    } catch (...) {  // a range name is not worth an exception
      length = 0;
    }
    push(std::string_view(name.data(), std::min(length, name.size() - 1)));
#else
    ((void)args, ...);
    (void)format;
#endif
  }
  ~TraceRange() {
#if defined(L3_HAVE_NVTX)
    nvtxRangePop();
#endif
  }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
  TraceRange(TraceRange&&) = delete;
  TraceRange& operator=(TraceRange&&) = delete;

 private:
  static void push(std::string_view name) noexcept {
#if defined(L3_HAVE_NVTX)
    std::array<char, 64> text{};
    const std::size_t n = std::min(name.size(), text.size() - 1);
    std::copy_n(name.data(), n, text.data());
    nvtxRangePushA(text.data());
#else
    (void)name;
#endif
  }
};

}  // namespace l3::core
