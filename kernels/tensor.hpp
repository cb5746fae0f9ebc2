// Flat arrays on a backend's memory (host for cpu, device for cuda): element types, shapes,
// non-owning views that carry their shape and whether they may be written, and an owning buffer.
//
// A view's dimension 0 is its rows (tokens, for activations: (N, H), (N, heads, head_dim));
// an op that reads a tensor as a matrix reads it as (rows, numel / rows).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
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

// A tensor's dimensions, outermost first: rank 1 to 4 (the model's largest is
// (N, heads, head_dim)). Row-major and contiguous: no strides.
class Shape {
 public:
  static constexpr int kMaxRank = 4;

  Shape() noexcept = default;  // (0): an empty vector
  // One dimension: a flat array of `numel` elements (implicit, as a length is a 1-D shape).
  Shape(std::int64_t numel) noexcept { dims_[0] = numel; }  // NOLINT(*-explicit-*)
  // Throws for more than kMaxRank dimensions or a negative one.
  Shape(std::initializer_list<std::int64_t> dims);

  [[nodiscard]] int rank() const noexcept { return rank_; }
  // Dimension i (0 <= i < rank); unchecked.
  [[nodiscard]] std::int64_t operator[](int i) const noexcept {
    return dims_[static_cast<std::size_t>(i)];
  }
  [[nodiscard]] std::int64_t numel() const noexcept;
  [[nodiscard]] std::int64_t rows() const noexcept { return dims_[0]; }
  // Elements per row: the product of dimensions 1 .. rank-1 (1 for a vector).
  [[nodiscard]] std::int64_t row_size() const noexcept;
  // The same shape with `rows` in dimension 0.
  [[nodiscard]] Shape with_rows(std::int64_t rows) const noexcept;
  // "(4, 8, 64)", for error messages.
  [[nodiscard]] std::string str() const;

  friend bool operator==(const Shape& a, const Shape& b) noexcept;

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 1;
};

namespace detail {
// The checks of the views' reshaping members (tensor.cpp); they throw core::internal_error.
void check_slice(std::int64_t offset, std::int64_t count, std::int64_t numel);
void check_reshape(const Shape& from, const Shape& to);
void check_first(const Shape& wanted, std::int64_t numel);
void check_dtype(DType have, DType wanted);
}  // namespace detail

// A typed window onto a flat array, with its shape. TensorView may be written through; a
// ConstTensorView only read (an op's inputs), and every TensorView converts to one. Copying a
// view never copies data.
template <bool Const>
class BasicTensorView {
 public:
  using Pointer = std::conditional_t<Const, const void*, void*>;
  template <typename T>
  using Element = std::conditional_t<Const, const T, T>;

  BasicTensorView() noexcept = default;
  BasicTensorView(Pointer data, DType dtype, Shape shape) noexcept
      : data_(data), dtype_(dtype), shape_(shape) {}
  // A span as a 1-D view; a read-only view only of a span of const elements.
  template <typename T>
  requires(Const || !std::is_const_v<T>) explicit BasicTensorView(std::span<T> values) noexcept
      : data_(values.data()),
        dtype_(dtype_of<T>),
        shape_(static_cast<std::int64_t>(values.size())) {}
  // A view that may be written is also one that may be read.
  template <bool OtherConst>
  requires(Const && !OtherConst) BasicTensorView(const BasicTensorView<OtherConst>& other)
  noexcept  // NOLINT(*-explicit-*)
      : data_(other.data()), dtype_(other.dtype()), shape_(other.shape()) {}

  [[nodiscard]] Pointer data() const noexcept { return data_; }
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
  [[nodiscard]] int rank() const noexcept { return shape_.rank(); }
  [[nodiscard]] std::int64_t dim(int i) const noexcept { return shape_[i]; }
  [[nodiscard]] std::int64_t rows() const noexcept { return shape_.rows(); }
  [[nodiscard]] std::int64_t row_size() const noexcept { return shape_.row_size(); }
  [[nodiscard]] std::int64_t numel() const noexcept { return shape_.numel(); }
  [[nodiscard]] std::size_t bytes() const noexcept {
    return static_cast<std::size_t>(numel()) * dtype_size(dtype_);
  }
  [[nodiscard]] bool empty() const noexcept { return numel() == 0; }

  // Flat elements [offset, offset + count) as a 1-D view; throws if out of range.
  [[nodiscard]] BasicTensorView slice(std::int64_t offset, std::int64_t count) const {
    detail::check_slice(offset, count, numel());
    return {advance(offset), dtype_, Shape(count)};
  }
  // The same elements as `shape` (the same number of them); throws otherwise.
  [[nodiscard]] BasicTensorView reshape(const Shape& shape) const {
    detail::check_reshape(shape_, shape);
    return {data_, dtype_, shape};
  }
  // The leading shape.numel() elements as `shape`; throws if there are fewer.
  [[nodiscard]] BasicTensorView first(const Shape& shape) const {
    detail::check_first(shape, numel());
    return {data_, dtype_, shape};
  }
  // The first `rows` rows, the other dimensions unchanged; throws if there are fewer.
  [[nodiscard]] BasicTensorView first_rows(std::int64_t rows) const {
    return first(shape_.with_rows(rows));
  }

  // The elements as a typed span (const for a ConstTensorView); throws if T does not match the
  // dtype.
  template <typename T>
  [[nodiscard]] std::span<Element<T>> as() const {
    detail::check_dtype(dtype_, dtype_of<T>);
    return {static_cast<Element<T>*>(data_), static_cast<std::size_t>(numel())};
  }

 private:
  [[nodiscard]] Pointer advance(std::int64_t offset) const noexcept {
    using Byte = std::conditional_t<Const, const std::byte, std::byte>;
    return static_cast<Byte*>(data_) + static_cast<std::size_t>(offset) * dtype_size(dtype_);
  }

  Pointer data_ = nullptr;
  DType dtype_ = DType::f32;
  Shape shape_;
};

using TensorView = BasicTensorView<false>;
using ConstTensorView = BasicTensorView<true>;

// An owning flat array allocated by a backend, released with the backend's deallocator. Its
// shape is 1-D unless given one (reshape).
class Buffer {
 public:
  using Deleter = void (*)(void*) noexcept;

  Buffer() noexcept = default;
  Buffer(void* data, DType dtype, std::int64_t numel, Deleter deleter) noexcept
      : data_(data, deleter), dtype_(dtype), shape_(numel) {}

  // Gives the buffer `shape` (the same number of elements); throws otherwise.
  Buffer& reshape(const Shape& shape) {
    detail::check_reshape(shape_, shape);
    shape_ = shape;
    return *this;
  }

  [[nodiscard]] TensorView view() const noexcept { return {data_.get(), dtype_, shape_}; }
  [[nodiscard]] TensorView slice(std::int64_t offset, std::int64_t count) const {
    return view().slice(offset, count);
  }
  [[nodiscard]] TensorView first(const Shape& shape) const { return view().first(shape); }
  [[nodiscard]] TensorView first_rows(std::int64_t rows) const { return view().first_rows(rows); }
  template <typename T>
  [[nodiscard]] std::span<T> as() const {
    return view().as<T>();
  }
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
  [[nodiscard]] std::int64_t numel() const noexcept { return shape_.numel(); }
  [[nodiscard]] std::size_t bytes() const noexcept { return view().bytes(); }

 private:
  std::unique_ptr<void, Deleter> data_{nullptr, nullptr};
  DType dtype_ = DType::f32;
  Shape shape_;
};

}  // namespace l3::kernels
