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

TensorView TensorView::slice(std::int64_t offset, std::int64_t count) const {
  if (offset < 0 || count < 0 || offset + count > numel_) {
    throw core::internal_error(fmt::format("tensor slice [{}, {}) out of range (size {})", offset,
                                           offset + count, numel_));
  }
  return {static_cast<std::byte*>(data_) + static_cast<std::size_t>(offset) * dtype_size(dtype_),
          dtype_, count};
}

void TensorView::check_dtype(DType wanted) const {
  if (wanted != dtype_) {
    throw core::internal_error(
        fmt::format("tensor of {} read as {}", dtype_name(dtype_), dtype_name(wanted)));
  }
}

}  // namespace l3::kernels
