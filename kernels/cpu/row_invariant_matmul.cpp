#include <cmath>

#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/vector_math.hpp"

namespace l3::kernels::cpu {

namespace {

constexpr int kLanes = 16;
constexpr int kTileRows = 4;
constexpr int kTileCols = 4;

// A (R x C) tile of y: rows x[0..R) (stride k), W's rows w[0..C) (stride k).
template <int R, int C>
L3_FMA_CLONES void tile(float* y, std::int64_t y_stride, const float* x, const float* w,
                        std::int64_t k, bool accumulate) {
  float acc[R][C][kLanes] = {};  // NOLINT(*-avoid-c-arrays): registers
  std::int64_t base = 0;
  for (; base + kLanes <= k; base += kLanes) {
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        const float* xr = x + r * k + base;
        const float* wc = w + c * k + base;
#pragma omp simd
        for (int l = 0; l < kLanes; ++l) acc[r][c][l] = std::fma(xr[l], wc[l], acc[r][c][l]);
      }
    }
  }
  const auto tail = static_cast<int>(k - base);
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float* lanes = acc[r][c];
      for (int l = 0; l < tail; ++l) {
        lanes[l] = std::fma(x[r * k + base + l], w[c * k + base + l], lanes[l]);
      }
      for (int width = kLanes / 2; width >= 1; width /= 2) {
        for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
      }
      float& out = y[r * y_stride + c];
      out = accumulate ? out + lanes[0] : lanes[0];
    }
  }
}

template <int R>
void tile_cols(int cols, float* y, std::int64_t y_stride, const float* x, const float* w,
               std::int64_t k, bool accumulate) {
  switch (cols) {
    case 1:
      tile<R, 1>(y, y_stride, x, w, k, accumulate);
      break;
    case 2:
      tile<R, 2>(y, y_stride, x, w, k, accumulate);
      break;
    case 3:
      tile<R, 3>(y, y_stride, x, w, k, accumulate);
      break;
    default:
      tile<R, kTileCols>(y, y_stride, x, w, k, accumulate);
      break;
  }
}

void any_tile(int rows, int cols, float* y, std::int64_t y_stride, const float* x, const float* w,
              std::int64_t k, bool accumulate) {
  switch (rows) {
    case 1:
      tile_cols<1>(cols, y, y_stride, x, w, k, accumulate);
      break;
    case 2:
      tile_cols<2>(cols, y, y_stride, x, w, k, accumulate);
      break;
    case 3:
      tile_cols<3>(cols, y, y_stride, x, w, k, accumulate);
      break;
    default:
      tile_cols<kTileRows>(cols, y, y_stride, x, w, k, accumulate);
      break;
  }
}

}  // namespace

void matmul_row_invariant(std::span<float> y, std::span<const float> x, std::span<const float> w,
                          std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate) {
  require_size(y.size(), m * n, "matmul", "y");
  require_size(x.size(), m * k, "matmul", "x");
  require_size(w.size(), n * k, "matmul", "w");
  if (m == 0 || n == 0) return;
  const std::int64_t col_tiles = (n + kTileCols - 1) / kTileCols;
  // Threads over W's rows: each reads its share of the weights once for all of x's rows.
#pragma omp parallel for schedule(static)
  for (std::int64_t ct = 0; ct < col_tiles; ++ct) {
    const std::int64_t col = ct * kTileCols;
    const auto cols = static_cast<int>(std::min<std::int64_t>(kTileCols, n - col));
    for (std::int64_t row = 0; row < m; row += kTileRows) {
      const auto rows = static_cast<int>(std::min<std::int64_t>(kTileRows, m - row));
      any_tile(rows, cols, y.data() + row * n + col, n, x.data() + row * k, w.data() + col * k, k,
               accumulate);
    }
  }
}

}  // namespace l3::kernels::cpu
