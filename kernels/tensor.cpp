#include "kernels/tensor.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace l3::kernels {

std::string_view dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::u8:
      return "u8";
    case DType::f64:
      return "f64";
  }
  return "?";
}

Shape::Shape(std::initializer_list<std::int64_t> dims) : rank_(static_cast<int>(dims.size())) {
  if (dims.size() == 0 || dims.size() > kMaxRank) {
    throw core::internal_error(
        fmt::format("a shape has 1 to {} dimensions, not {}", kMaxRank, dims.size()));
  }
  std::size_t i = 0;
  for (const std::int64_t d : dims) {
    if (d < 0) throw core::internal_error(fmt::format("negative dimension {} in a shape", d));
    dims_[i++] = d;
  }
}

std::int64_t Shape::numel() const noexcept { return dims_[0] * row_size(); }

std::int64_t Shape::row_size() const noexcept {
  std::int64_t size = 1;
  for (int i = 1; i < rank_; ++i) size *= dims_[static_cast<std::size_t>(i)];
  return size;
}

Shape Shape::with_rows(std::int64_t rows) const noexcept {
  Shape s = *this;
  s.dims_[0] = rows;
  return s;
}

std::string Shape::str() const {
  std::string text = "(";
  for (int i = 0; i < rank_; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(dims_[static_cast<std::size_t>(i)]);
  }
  return text + ")";
}

bool operator==(const Shape& a, const Shape& b) noexcept {
  if (a.rank_ != b.rank_) return false;
  for (int i = 0; i < a.rank_; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

namespace detail {

void check_slice(std::int64_t offset, std::int64_t count, std::int64_t numel) {
  if (offset < 0 || count < 0 || offset + count > numel) {
    throw core::internal_error(
        fmt::format("tensor slice [{}, {}) out of range (size {})", offset, offset + count, numel));
  }
}

void check_reshape(const Shape& from, const Shape& to) {
  if (from.numel() != to.numel()) {
    throw core::internal_error(fmt::format("tensor of shape {} reshaped to {}: {} elements, not {}",
                                           from.str(), to.str(), from.numel(), to.numel()));
  }
}

void check_first(const Shape& wanted, std::int64_t numel) {
  if (wanted.numel() > numel) {
    throw core::internal_error(fmt::format("tensor of {} elements has no leading {} ({} elements)",
                                           numel, wanted.str(), wanted.numel()));
  }
}

void check_dtype(DType have, DType wanted) {
  if (wanted != have) {
    throw core::internal_error(
        fmt::format("tensor of {} read as {}", dtype_name(have), dtype_name(wanted)));
  }
}

}  // namespace detail

}  // namespace l3::kernels
