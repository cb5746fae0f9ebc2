// Views that carry their shape and constness (kernels/tensor.hpp), the op sizes derived from
// them (kernels/op_shapes.hpp), and the ProfilingOps decorator forwarding the argument structs.
#include "kernels/op_shapes.hpp"

#include <string>
#include <type_traits>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/profiling_ops.hpp"

using l3::kernels::Buffer;
using l3::kernels::ConstTensorView;
using l3::kernels::DType;
using l3::kernels::Shape;
using l3::kernels::TensorView;

// Constness is a type: inputs cannot be written, and read-only memory never becomes writable.
static_assert(std::is_convertible_v<TensorView, ConstTensorView>);
static_assert(!std::is_constructible_v<TensorView, ConstTensorView>);
static_assert(!std::is_constructible_v<TensorView, std::span<const float>>);
static_assert(std::is_constructible_v<ConstTensorView, std::span<const float>>);
static_assert(
    std::is_same_v<decltype(std::declval<ConstTensorView>().as<float>()), std::span<const float>>);
static_assert(std::is_same_v<decltype(std::declval<TensorView>().as<float>()), std::span<float>>);

namespace {

// The message of the internal error that `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const l3::core::Error& e) {
    return e.message();
  }
  return {};
}

// A view of `shape` over nothing: op_shapes reads shapes only.
TensorView shaped(const Shape& shape, DType dtype = DType::f32) { return {nullptr, dtype, shape}; }

}  // namespace

TEST_CASE("a shape's rows, row size and elements", "[kernels][tensor]") {
  const Shape s{6, 4, 8};
  CHECK(s.rank() == 3);
  CHECK(s.rows() == 6);
  CHECK(s.row_size() == 32);
  CHECK(s.numel() == 192);
  CHECK(s.with_rows(2) == Shape{2, 4, 8});
  CHECK(s.str() == "(6, 4, 8)");
  CHECK(Shape(5) == Shape{5});
  CHECK(Shape(5).row_size() == 1);
  CHECK(Shape{0, 7}.numel() == 0);
  CHECK_FALSE(Shape{2, 3} == Shape{3, 2});
  CHECK_THROWS_AS((Shape{1, 2, 3, 4, 5}), l3::core::Error);
  CHECK_THROWS_AS((Shape{2, -1}), l3::core::Error);
}

TEST_CASE("views reshape, take leading rows and slice flat, within their elements",
          "[kernels][tensor]") {
  std::vector<float> values(24);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const TensorView flat{std::span<float>(values)};
  CHECK(flat.shape() == Shape(24));

  const TensorView x = flat.reshape({4, 2, 3});
  CHECK(x.rows() == 4);
  CHECK(x.row_size() == 6);
  const TensorView two = x.first_rows(2);
  CHECK(two.shape() == Shape{2, 2, 3});
  CHECK(two.data() == x.data());
  CHECK(x.first({3, 5}).shape() == Shape{3, 5});
  const TensorView tail = x.slice(20, 4);  // flat, whatever the shape
  CHECK(tail.shape() == Shape(4));
  CHECK(tail.as<float>()[0] == 20.0F);

  CHECK(error_of([&] {
          (void)x.reshape({5, 5});
        }).find("(4, 2, 3) reshaped to (5, 5)") != std::string::npos);
  CHECK_THROWS_AS(x.first_rows(5), l3::core::Error);
  CHECK_THROWS_AS(x.first({5, 5}), l3::core::Error);
  CHECK_THROWS_AS(x.slice(20, 5), l3::core::Error);
  CHECK_THROWS_AS(x.as<std::int32_t>(), l3::core::Error);

  const ConstTensorView read = x;  // a writable view is also a readable one
  CHECK(read.shape() == x.shape());
  CHECK(read.as<float>()[23] == 23.0F);
  CHECK(read.first_rows(1).shape() == Shape{1, 2, 3});
}

TEST_CASE("a buffer keeps the shape it is given", "[kernels][tensor]") {
  l3::kernels::CpuOps ops;
  const Buffer b = l3::kernels::allocate(ops, DType::f32, {3, 4});
  CHECK(b.shape() == Shape{3, 4});
  CHECK(b.view().first_rows(2).shape() == Shape{2, 4});
  CHECK(b.slice(0, 5).shape() == Shape(5));
  Buffer c = ops.allocate(DType::i32, 12);
  CHECK(c.shape() == Shape(12));
  CHECK_THROWS_AS(c.reshape({5, 2}), l3::core::Error);
  c.reshape({2, 6});
  CHECK(c.view().rows() == 2);
}

TEST_CASE("matmul sizes come from the views, activations read as matrices of their rows",
          "[kernels][op_shapes]") {
  // y (M, N) = x (M, K) W^T: M = 5, N = 3, K = 8, x given as (5, 2, 4) heads.
  const auto d =
      l3::kernels::matmul_dims({.y = shaped({5, 3}), .x = shaped({5, 2, 4}), .w = shaped({3, 8})});
  CHECK(d.m == 5);
  CHECK(d.n == 3);
  CHECK(d.k == 8);
  const std::string wrong = error_of([] {
    (void)l3::kernels::matmul_dims({.y = shaped({5, 4}), .x = shaped({5, 8}), .w = shaped({3, 8})});
  });
  CHECK(wrong == "matmul: 'y' has shape (5, 4), expected 5 rows of 3");
  CHECK_THROWS_AS(
      l3::kernels::matmul_dims({.y = shaped({5, 3}), .x = shaped({5, 7}), .w = shaped({3, 8})}),
      l3::core::Error);
  // A flat view is not a matrix: the caller must say the shape.
  CHECK_THROWS_AS(
      l3::kernels::matmul_dims({.y = shaped(15), .x = shaped({5, 8}), .w = shaped({3, 8})}),
      l3::core::Error);
}

TEST_CASE("matmul_backward checks only what it reads", "[kernels][op_shapes]") {
  // dx only: x is not read, so its shape is not checked.
  const auto dx_only = l3::kernels::matmul_dims(l3::kernels::MatmulBackwardArgs{
      .dx = shaped({5, 8}), .dy = shaped({5, 3}), .w = shaped({3, 8})});
  CHECK(dx_only.k == 8);
  // dw only: K from x.
  const auto dw_only = l3::kernels::matmul_dims(l3::kernels::MatmulBackwardArgs{
      .dw = shaped({3, 8}), .dy = shaped({5, 3}), .x = shaped({5, 8})});
  CHECK(dw_only.k == 8);
  CHECK(dw_only.m == 5);
  CHECK(error_of([] {
          (void)l3::kernels::matmul_dims(l3::kernels::MatmulBackwardArgs{.dx = shaped({5, 8}),
                                                                         .dw = shaped({3, 7}),
                                                                         .dy = shaped({5, 3}),
                                                                         .x = shaped({5, 8}),
                                                                         .w = shaped({3, 8})});
        }) == "matmul_backward: 'dw' has shape (3, 7), expected 3 rows of 8");
}

TEST_CASE("attention sizes come from q, k and the segment table", "[kernels][op_shapes]") {
  const std::vector<std::int32_t> cu = {0, 4, 6};
  l3::kernels::AttentionArgs a{
      .out = shaped({6, 4, 8}),
      .lse = shaped({4, 6}),
      .q = shaped({6, 4, 8}),
      .k = shaped({6, 2, 8}),
      .v = shaped({6, 2, 8}),
      .segments = {.cu_seqlens = shaped(3, DType::i32), .max_segment = 4, .host = cu}};
  const l3::kernels::AttentionShape s = l3::kernels::attention_shape(a);
  CHECK(s.tokens == 6);
  CHECK(s.n_heads == 4);
  CHECK(s.n_kv_heads == 2);
  CHECK(s.head_dim == 8);
  CHECK(s.n_segments == 2);
  CHECK(s.max_segment == 4);
  CHECK(s.host_cu_seqlens.size() == 3);

  auto broken = a;
  broken.lse = shaped({6, 4});  // (N, heads) instead of (heads, N)
  CHECK(error_of([&] { (void)l3::kernels::attention_shape(broken); }) ==
        "attention: 'lse' has shape (6, 4), expected 4 rows of 6");
  broken = a;
  broken.k = shaped({6, 3, 8});  // 3 KV heads do not divide 4 heads
  broken.v = broken.k;
  CHECK_THROWS_AS(l3::kernels::attention_shape(broken), l3::core::Error);
  broken = a;
  broken.q = shaped({6, 32});  // heads folded: rank 3 is required
  CHECK_THROWS_AS(l3::kernels::attention_shape(broken), l3::core::Error);
  broken = a;
  broken.segments.cu_seqlens = shaped(4, DType::i32);  // disagrees with the host copy
  CHECK_THROWS_AS(l3::kernels::attention_shape(broken), l3::core::Error);
}

TEST_CASE("the heads and loss ops derive their sizes and refuse mismatches",
          "[kernels][op_shapes]") {
  const auto rope = l3::kernels::rope_dims({.x = shaped({6, 4, 8}),
                                            .positions = shaped(6, DType::i32),
                                            .cos = shaped({32, 4}),
                                            .sin = shaped({32, 4})});
  CHECK(rope.tokens == 6);
  CHECK(rope.heads == 4);
  CHECK(rope.head_dim == 8);
  CHECK_THROWS_AS(l3::kernels::rope_dims({.x = shaped({6, 4, 8}),
                                          .positions = shaped(6, DType::i32),
                                          .cos = shaped(128),
                                          .sin = shaped(128)}),
                  l3::core::Error);

  const auto lm = l3::kernels::lm_head_dims({.loss_sum = shaped(1, DType::f64),
                                             .h = shaped({6, 16}),
                                             .w = shaped({50, 16}),
                                             .rows = shaped(4, DType::i32),
                                             .targets = shaped(4, DType::i32)});
  CHECK(lm.n == 6);
  CHECK(lm.counted == 4);
  CHECK(lm.vocab == 50);
  CHECK(lm.hidden == 16);
  CHECK_THROWS_AS(l3::kernels::lm_head_dims({.loss_sum = shaped(1, DType::f64),
                                             .dh = shaped({6, 16}),
                                             .dw = shaped({50, 15}),
                                             .h = shaped({6, 16}),
                                             .w = shaped({50, 16}),
                                             .rows = shaped(4, DType::i32),
                                             .targets = shaped(4, DType::i32)}),
                  l3::core::Error);

  CHECK(l3::kernels::bradley_terry_pairs(
            {.sums = shaped(3, DType::f64), .scores = shaped(6), .margins = shaped(3)}) == 3);
  CHECK_THROWS_AS(l3::kernels::bradley_terry_pairs(
                      {.sums = shaped(3, DType::f64), .scores = shaped(6), .margins = shaped(2)}),
                  l3::core::Error);
  CHECK(l3::kernels::rmsnorm_dims(
            {.out = shaped({6, 16}), .rstd = shaped(6), .x = shaped({6, 16}), .w = shaped(16)})
            .hidden == 16);
  CHECK_THROWS_AS(l3::kernels::swiglu_size(
                      {.out = shaped({6, 16}), .gate = shaped({6, 16}), .up = shaped({16, 6})}),
                  l3::core::Error);
}

TEST_CASE("ProfilingOps forwards each op's arguments and times it under its name",
          "[kernels][profiling]") {
  l3::kernels::CpuOps cpu;
  l3::kernels::ProfilingOps profiled(cpu);
  CHECK(profiled.name() == cpu.name());
  CHECK(profiled.backend() == cpu.backend());
  CHECK(profiled.report() == cpu.report());
  profiled.bind_thread();

  std::vector<float> x = {1, 2, 3, 4, 5, 6};  // (2, 3)
  std::vector<float> w = {1, 0, 0, 0, 1, 1};  // (2, 3)
  std::vector<float> direct(4);
  std::vector<float> through(4);
  const auto view = [](std::vector<float>& v, const Shape& s) {
    return TensorView(std::span<float>(v)).reshape(s);
  };
  cpu.matmul({.y = view(direct, {2, 2}), .x = view(x, {2, 3}), .w = view(w, {2, 3})});
  profiled.matmul({.y = view(through, {2, 2}), .x = view(x, {2, 3}), .w = view(w, {2, 3})});
  CHECK(through == direct);
  CHECK(through == std::vector<float>{1, 5, 4, 11});
  REQUIRE(profiled.times().count("matmul") == 1);
  CHECK(profiled.times().at("matmul").count() == 1);
  CHECK(profiled.sum_squares(ConstTensorView(std::span<const float>(x))) == 91.0);
  CHECK(profiled.times().at("sum_squares").count() == 1);
}
