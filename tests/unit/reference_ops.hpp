// Naive fp64 references of the Llama layers, written independently of the kernels (plain loops,
// the textbook formulas): the oracle for the CPU kernels' forward passes, and the functions
// whose finite differences check their backward passes.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace l3::test::reference {

using Vec = std::vector<double>;

// y (M, N) = x (M, K) W^T, W (N, K)
inline Vec matmul(const Vec& x, const Vec& w, std::int64_t m, std::int64_t n, std::int64_t k) {
  Vec y(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p)
        s += x[static_cast<std::size_t>(i * k + p)] * w[static_cast<std::size_t>(j * k + p)];
      y[static_cast<std::size_t>(i * n + j)] = s;
    }
  return y;
}

inline Vec rmsnorm(const Vec& x, const Vec& w, std::int64_t hidden, double eps) {
  Vec y(x.size());
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / hidden;
  for (std::int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (std::int64_t i = 0; i < hidden; ++i)
      ss +=
          x[static_cast<std::size_t>(r * hidden + i)] * x[static_cast<std::size_t>(r * hidden + i)];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(hidden) + eps);
    for (std::int64_t i = 0; i < hidden; ++i) {
      const auto j = static_cast<std::size_t>(r * hidden + i);
      y[j] = x[j] * inv * w[static_cast<std::size_t>(i)];
    }
  }
  return y;
}

// x (N, heads, head_dim); angle of pair i at position p = p * inv_freq[i] (in double)
inline Vec rope(const Vec& x, const std::vector<std::int32_t>& positions,
                const std::vector<float>& inv_freq, int heads, int head_dim) {
  Vec y(x.size());
  const int half = head_dim / 2;
  for (std::size_t t = 0; t < positions.size(); ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double angle =
            positions[t] * static_cast<double>(inv_freq[static_cast<std::size_t>(i)]);
        const std::size_t base =
            (t * static_cast<std::size_t>(heads) + static_cast<std::size_t>(h)) *
            static_cast<std::size_t>(head_dim);
        const double x1 = x[base + static_cast<std::size_t>(i)];
        const double x2 = x[base + static_cast<std::size_t>(i + half)];
        y[base + static_cast<std::size_t>(i)] = x1 * std::cos(angle) - x2 * std::sin(angle);
        y[base + static_cast<std::size_t>(i + half)] = x2 * std::cos(angle) + x1 * std::sin(angle);
      }
  return y;
}

// Causal attention inside each segment; query head h uses K/V head h / (heads / kv_heads).
inline Vec attention(const Vec& q, const Vec& k, const Vec& v,
                     const std::vector<std::int32_t>& cu_seqlens, int heads, int kv_heads,
                     int head_dim) {
  Vec out(q.size(), 0.0);
  const int group = heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  auto qi = [&](std::int64_t t, int h, int d) {
    return q[static_cast<std::size_t>((t * heads + h) * head_dim + d)];
  };
  auto ki = [&](std::int64_t t, int h, int d) {
    return k[static_cast<std::size_t>((t * kv_heads + h) * head_dim + d)];
  };
  auto vi = [&](std::int64_t t, int h, int d) {
    return v[static_cast<std::size_t>((t * kv_heads + h) * head_dim + d)];
  };
  for (std::size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    for (std::int64_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; ++t) {
      for (int h = 0; h < heads; ++h) {
        const int g = h / group;
        std::vector<double> scores;
        double max = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = cu_seqlens[s]; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < head_dim; ++d) dot += qi(t, h, d) * ki(j, g, d);
          scores.push_back(dot * scale);
          max = std::max(max, dot * scale);
        }
        double sum = 0;
        for (double& sc : scores) sum += (sc = std::exp(sc - max));
        for (int d = 0; d < head_dim; ++d) {
          double o = 0;
          for (std::size_t j = 0; j < scores.size(); ++j)
            o += scores[j] / sum * vi(cu_seqlens[s] + static_cast<std::int64_t>(j), g, d);
          out[static_cast<std::size_t>((t * heads + h) * head_dim + d)] = o;
        }
      }
    }
  }
  return out;
}

inline Vec swiglu(const Vec& gate, const Vec& up) {
  Vec out(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i)
    out[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  return out;
}

// Sum over counted positions of -log softmax(h W^T)[target]
// Sum over the masked positions of the cross-entropy of softmax(logit_scale * h w^T).
inline double cross_entropy(const Vec& h, const Vec& w, const std::vector<std::int32_t>& targets,
                            const std::vector<std::uint8_t>& mask, std::int64_t vocab,
                            std::int64_t hidden, double logit_scale = 1.0) {
  double total = 0;
  for (std::size_t t = 0; t < targets.size(); ++t) {
    if (mask[t] == 0) continue;
    std::vector<double> logits(static_cast<std::size_t>(vocab));
    double max = -std::numeric_limits<double>::infinity();
    for (std::int64_t v = 0; v < vocab; ++v) {
      double s = 0;
      for (std::int64_t i = 0; i < hidden; ++i)
        s += h[t * static_cast<std::size_t>(hidden) + static_cast<std::size_t>(i)] *
             w[static_cast<std::size_t>(v * hidden + i)];
      logits[static_cast<std::size_t>(v)] = logit_scale * s;
      max = std::max(max, logit_scale * s);
    }
    double sum = 0;
    for (const double l : logits) sum += std::exp(l - max);
    total += max + std::log(sum) - logits[static_cast<std::size_t>(targets[t])];
  }
  return total;
}

}  // namespace l3::test::reference
