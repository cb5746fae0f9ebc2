// Flat arrays on a backend's memory (host for cpu, device for cuda): element types, a
// non-owning view that checks its element type when read as a typed span, and an owning buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>

namespace l3::kernels {

enum class DType : std::uint8_t { f32, bf16, i32, u8, f64 };

[[nodiscard]] constexpr std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
    case DType::u8:
      return 1;
    case DType::f64:
      return 8;
  }
  return 0;
}
[[nodiscard]] std::string_view dtype_name(DType dtype) noexcept;

// bfloat16 storage on the host (the CUDA backend reinterprets it as __nv_bfloat16).
struct BFloat16 {
  std::uint16_t bits;
};

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <typename T>
inline constexpr DType dtype_of = DTypeOf<std::remove_const_t<T>>::value;

// A typed window onto a flat array. Copying a view never copies data.
class TensorView {
 public:
  TensorView() noexcept = default;
  TensorView(void* data, DType dtype, std::int64_t numel) noexcept
      : data_(data), dtype_(dtype), numel_(numel) {}
  template <typename T>
  explicit TensorView(std::span<T> values) noexcept
      : data_(const_cast<std::remove_const_t<T>*>(values.data())),  // NOLINT: views are untyped
        dtype_(dtype_of<T>),
        numel_(static_cast<std::int64_t>(values.size())) {}

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  [[nodiscard]] std::int64_t numel() const noexcept { return numel_; }
  [[nodiscard]] std::size_t bytes() const noexcept {
    return static_cast<std::size_t>(numel_) * dtype_size(dtype_);
  }
  [[nodiscard]] bool empty() const noexcept { return numel_ == 0; }

  // Elements [offset, offset + count); throws if out of range.
  [[nodiscard]] TensorView slice(std::int64_t offset, std::int64_t count) const;

  // The elements as a typed span; throws if T does not match the dtype.
  template <typename T>
  [[nodiscard]] std::span<T> as() const {
    check_dtype(dtype_of<T>);
    return {static_cast<T*>(data_), static_cast<std::size_t>(numel_)};
  }

 private:
  void check_dtype(DType wanted) const;

  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  std::int64_t numel_ = 0;
};

// An owning flat array allocated by a backend, released with the backend's deallocator.
class Buffer {
 public:
  using Deleter = void (*)(void*) noexcept;

  Buffer() noexcept = default;
  Buffer(void* data, DType dtype, std::int64_t numel, Deleter deleter) noexcept
      : data_(data, deleter), dtype_(dtype), numel_(numel) {}

  [[nodiscard]] TensorView view() const noexcept { return {data_.get(), dtype_, numel_}; }
  [[nodiscard]] TensorView slice(std::int64_t offset, std::int64_t count) const {
    return view().slice(offset, count);
  }
  template <typename T>
  [[nodiscard]] std::span<T> as() const {
    return view().as<T>();
  }
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  [[nodiscard]] std::int64_t numel() const noexcept { return numel_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return view().bytes(); }

 private:
  std::unique_ptr<void, Deleter> data_{nullptr, nullptr};
  DType dtype_ = DType::f32;
  std::int64_t numel_ = 0;
};

}  // namespace l3::kernels
