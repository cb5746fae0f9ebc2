// C++ element types and reduction operators as MPI's handles, so that the typed wrappers
// (collectives.hpp, point_to_point.hpp, request.hpp) pick the datatype from the values they are
// given instead of every call site naming MPI_FLOAT or MPI_INT64_T by hand.
#pragma once

#include <mpi.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace l3::dist {

// MpiType<T>::get(): the MPI datatype of one T. The types below are the ones the library sends;
// a type of a higher layer gets a specialisation where it travels (bf16 moves as its 16 bits,
// MPI_UINT16_T, in parallel/gradient_exchange.cpp).
template <typename T>
struct MpiType;

template <>
struct MpiType<float> {
  static MPI_Datatype get() noexcept { return MPI_FLOAT; }
};
template <>
struct MpiType<double> {
  static MPI_Datatype get() noexcept { return MPI_DOUBLE; }
};
template <>
struct MpiType<int> {
  static MPI_Datatype get() noexcept { return MPI_INT; }
};
template <>
struct MpiType<std::int64_t> {
  static MPI_Datatype get() noexcept { return MPI_INT64_T; }
};
template <>
struct MpiType<std::uint64_t> {
  static MPI_Datatype get() noexcept { return MPI_UINT64_T; }
};
template <>
struct MpiType<char> {
  static MPI_Datatype get() noexcept { return MPI_CHAR; }
};
template <>
struct MpiType<std::byte> {
  static MPI_Datatype get() noexcept { return MPI_BYTE; }
};
// long long is std::int64_t on some platforms (then the specialisation above serves it) and a
// type of its own on others (LP64 Linux, where std::int64_t is long).
template <typename T>
requires(std::same_as<T, long long> && !std::same_as<long long, std::int64_t>) struct MpiType<T> {
  static MPI_Datatype get() noexcept { return MPI_LONG_LONG; }
};

// A type the wrappers can send: one with an MpiType.
template <typename T>
concept MpiValue = requires {
  { MpiType<std::remove_cv_t<T>>::get() } -> std::same_as<MPI_Datatype>;
};

template <MpiValue T>
[[nodiscard]] MPI_Datatype mpi_type() noexcept {
  return MpiType<std::remove_cv_t<T>>::get();
}

// The reductions the library uses (bitwise ones on integer types only, as in MPI).
enum class ReduceOp { sum, max, min, bitwise_or, bitwise_xor };

[[nodiscard]] MPI_Op mpi_op(ReduceOp op) noexcept;

// `n` elements as MPI's int count. Throws an internal Error naming `call` and `what` when n does
// not fit (callers that may move more cut their data into pieces first).
[[nodiscard]] int mpi_count(std::size_t n, std::string_view call, std::string_view what);

}  // namespace l3::dist
