#include "kernels/cpu/attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/vector_math.hpp"

namespace l3::kernels::cpu {

namespace {

// Queries are processed in tiles of this many rows: big enough for SGEMM to run near peak,
// small enough that a tile's scores (kQueryTile x segment length) stay in cache-sized memory.
constexpr std::int64_t kQueryTile = 128;

struct Segments {
  std::int64_t tokens = 0;
  std::int64_t longest = 0;
};

Segments check_segments(std::span<const std::int32_t> cu_seqlens, std::string_view kernel) {
  if (cu_seqlens.empty() || cu_seqlens[0] != 0) {
    throw core::internal_error(fmt::format("cpu {}: cu_seqlens must start with 0", kernel));
  }
  Segments s;
  for (std::size_t i = 1; i < cu_seqlens.size(); ++i) {
    const std::int64_t length = cu_seqlens[i] - cu_seqlens[i - 1];
    if (length < 0) {
      throw core::internal_error(fmt::format("cpu {}: cu_seqlens decreases at {}", kernel, i));
    }
    s.longest = std::max(s.longest, length);
  }
  s.tokens = cu_seqlens.back();
  return s;
}

void check_heads(AttentionHeads h, std::string_view kernel) {
  if (h.n_heads <= 0 || h.n_kv_heads <= 0 || h.head_dim <= 0 || h.n_heads % h.n_kv_heads != 0) {
    throw core::internal_error(fmt::format("cpu {}: bad heads {} / kv heads {} / head dim {}",
                                           kernel, h.n_heads, h.n_kv_heads, h.head_dim));
  }
}

// A run of queries whose tokens are consecutive in one segment: local rows
// [local, local + length) are the tokens [start + first, start + first + length).
struct QueryRun {
  std::size_t segment = 0;  // index into cu_seqlens
  std::int64_t start = 0;   // the segment's first token
  std::int64_t first = 0;   // the run's first token, relative to the segment
  std::int64_t local = 0;   // the run's first query row
  std::int64_t length = 0;
};

// The runs of the query rows: every token when query_rows is empty (one run per non-empty
// segment), else the listed tokens, strictly ascending below cu_seqlens.back().
std::vector<QueryRun> query_runs(std::span<const std::int32_t> cu_seqlens,
                                 std::span<const std::int32_t> query_rows,
                                 std::string_view kernel) {
  std::vector<QueryRun> runs;
  if (query_rows.empty()) {
    for (std::size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
      const std::int64_t length = cu_seqlens[s + 1] - cu_seqlens[s];
      if (length > 0) runs.push_back({s, cu_seqlens[s], 0, cu_seqlens[s], length});
    }
    return runs;
  }
  const std::int64_t keys = cu_seqlens.back();
  std::size_t segment = 0;
  for (std::size_t i = 0; i < query_rows.size(); ++i) {
    const std::int64_t token = query_rows[i];
    if (token < 0 || token >= keys || (i > 0 && token <= query_rows[i - 1])) {
      throw core::internal_error(fmt::format(
          "cpu {}: query row {} is token {}: rows must ascend below {}", kernel, i, token, keys));
    }
    while (cu_seqlens[segment + 1] <= token) ++segment;
    QueryRun* last = runs.empty() ? nullptr : &runs.back();
    if (last != nullptr && last->segment == segment &&
        last->start + last->first + last->length == token) {
      ++last->length;
      continue;
    }
    runs.push_back({segment, cu_seqlens[segment], token - cu_seqlens[segment],
                    static_cast<std::int64_t>(i), 1});
  }
  return runs;
}

// Turns a tile of scaled scores into probabilities in place: row r is query `first + r`,
// which sees keys 0..first+r. Writes each row's log-sum-exp to lse[r * lse_stride].
void causal_softmax(float* scores, std::int64_t rows, std::int64_t cols, std::int64_t first,
                    float* lse, std::int64_t lse_stride) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * cols;
    const std::int64_t visible = first + r + 1;
    const SoftmaxRow s = exp_row(row, visible);
    scale_row(row, visible, 1.0F / s.sum);
    std::fill(row + visible, row + cols, 0.0F);
    lse[r * lse_stride] = s.max + std::log(s.sum);
  }
}

}  // namespace

void attention(std::span<float> out, std::span<float> lse, std::span<const float> q,
               std::span<const float> k, std::span<const float> v,
               std::span<const std::int32_t> cu_seqlens, AttentionHeads heads,
               std::span<const std::int32_t> query_rows) {
  check_heads(heads, "attention");
  const Segments segments = check_segments(cu_seqlens, "attention");
  const std::int64_t n = segments.tokens;  // keys
  const std::int64_t nq = query_rows.empty() ? n : static_cast<std::int64_t>(query_rows.size());
  const std::int64_t hd = heads.head_dim;
  const std::int64_t q_stride = heads.n_heads * hd;
  const std::int64_t kv_stride = heads.n_kv_heads * hd;
  require_size(q.size(), nq * q_stride, "attention", "q");
  require_size(out.size(), nq * q_stride, "attention", "out");
  require_size(k.size(), n * kv_stride, "attention", "k");
  require_size(v.size(), n * kv_stride, "attention", "v");
  require_size(lse.size(), nq * heads.n_heads, "attention", "lse");
  const int group = heads.n_heads / heads.n_kv_heads;
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));

  // Work items: (run of queries, head, query tile), all independent.
  struct Item {
    std::int64_t start;  // first token of the segment
    std::int64_t first;  // first query of the tile, relative to the segment
    std::int64_t local;  // its query row
    std::int64_t rows;   // queries in the tile
    int head;
  };
  std::vector<Item> items;
  for (const QueryRun& run : query_runs(cu_seqlens, query_rows, "attention")) {
    for (int h = 0; h < heads.n_heads; ++h) {
      for (std::int64_t done = 0; done < run.length; done += kQueryTile) {
        items.push_back({run.start, run.first + done, run.local + done,
                         std::min(kQueryTile, run.length - done), h});
      }
    }
  }

#pragma omp parallel
  {
    std::vector<float> scores(static_cast<std::size_t>(kQueryTile * segments.longest));
#pragma omp for schedule(dynamic)
    for (std::size_t i = 0; i < items.size(); ++i) {  // NOLINT(modernize-loop-convert): omp for
      const Item& it = items[i];
      const std::int64_t keys = it.first + it.rows;  // causal: the tile sees keys [0, keys)
      const int kv_head = it.head / group;
      const float* q_tile = q.data() + it.local * q_stride + it.head * hd;
      const float* k_seg = k.data() + it.start * kv_stride + kv_head * hd;
      const float* v_seg = v.data() + it.start * kv_stride + kv_head * hd;
      float* out_tile = out.data() + it.local * q_stride + it.head * hd;
      // scores (rows, keys) = scale * q_tile (rows, hd) . k_seg^T (hd, keys)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(it.rows),
                  static_cast<int>(keys), static_cast<int>(hd), scale, q_tile,
                  static_cast<int>(q_stride), k_seg, static_cast<int>(kv_stride), 0.0F,
                  scores.data(), static_cast<int>(keys));
      causal_softmax(scores.data(), it.rows, keys, it.first, lse.data() + it.head * nq + it.local,
                     1);
      // out_tile (rows, hd) = probabilities (rows, keys) . v_seg (keys, hd)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(it.rows),
                  static_cast<int>(hd), static_cast<int>(keys), 1.0F, scores.data(),
                  static_cast<int>(keys), v_seg, static_cast<int>(kv_stride), 0.0F, out_tile,
                  static_cast<int>(q_stride));
    }
  }
}

void attention_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv,
                        std::span<const float> dout, std::span<const float> out,
                        std::span<const float> lse, std::span<const float> q,
                        std::span<const float> k, std::span<const float> v,
                        std::span<const std::int32_t> cu_seqlens, AttentionHeads heads,
                        std::span<const std::int32_t> query_rows) {
  check_heads(heads, "attention_backward");
  const Segments segments = check_segments(cu_seqlens, "attention_backward");
  const std::int64_t n = segments.tokens;
  const std::int64_t nq = query_rows.empty() ? n : static_cast<std::int64_t>(query_rows.size());
  const std::int64_t hd = heads.head_dim;
  const std::int64_t q_stride = heads.n_heads * hd;
  const std::int64_t kv_stride = heads.n_kv_heads * hd;
  for (const auto& [size, name] :
       {std::pair{q.size(), "q"}, {dq.size(), "dq"}, {out.size(), "out"}, {dout.size(), "dout"}}) {
    require_size(size, nq * q_stride, "attention_backward", name);
  }
  for (const auto& [size, name] :
       {std::pair{k.size(), "k"}, {v.size(), "v"}, {dk.size(), "dk"}, {dv.size(), "dv"}}) {
    require_size(size, n * kv_stride, "attention_backward", name);
  }
  require_size(lse.size(), nq * heads.n_heads, "attention_backward", "lse");
  const int group = heads.n_heads / heads.n_kv_heads;
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));

  // Work items: (segment, kv head). An item owns its rows of dk/dv and, through the heads of
  // its group, the matching columns of its queries' dq, so items never write the same memory.
  // A segment without queries still zeroes its dk/dv.
  const std::vector<QueryRun> runs = query_runs(cu_seqlens, query_rows, "attention_backward");
  struct Item {
    std::int64_t start;
    std::int64_t length;
    std::size_t first_run, end_run;  // the segment's runs of queries
    int kv_head;
  };
  std::vector<Item> items;
  std::size_t run = 0;
  for (std::size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    const std::size_t first_run = run;
    while (run < runs.size() && runs[run].segment == s) ++run;
    for (int g = 0; g < heads.n_kv_heads; ++g) {
      items.push_back({cu_seqlens[s], cu_seqlens[s + 1] - cu_seqlens[s], first_run, run, g});
    }
  }

#pragma omp parallel
  {
    const auto tile = static_cast<std::size_t>(kQueryTile * segments.longest);
    std::vector<float> probs(tile);
    std::vector<float> dprobs(tile);
    std::vector<float> row_dot(static_cast<std::size_t>(kQueryTile));
#pragma omp for schedule(dynamic)
    for (std::size_t i = 0; i < items.size(); ++i) {  // NOLINT(modernize-loop-convert): omp for
      const Item& it = items[i];
      const float* k_seg = k.data() + it.start * kv_stride + it.kv_head * hd;
      const float* v_seg = v.data() + it.start * kv_stride + it.kv_head * hd;
      float* dk_seg = dk.data() + it.start * kv_stride + it.kv_head * hd;
      float* dv_seg = dv.data() + it.start * kv_stride + it.kv_head * hd;
      for (std::int64_t t = 0; t < it.length; ++t) {
        std::fill_n(dk_seg + t * kv_stride, hd, 0.0F);
        std::fill_n(dv_seg + t * kv_stride, hd, 0.0F);
      }
      for (int h = it.kv_head * group; h < (it.kv_head + 1) * group; ++h) {
        for (std::size_t r_i = it.first_run; r_i < it.end_run; ++r_i) {
          const QueryRun& qr = runs[r_i];
          for (std::int64_t done = 0; done < qr.length; done += kQueryTile) {
            const std::int64_t first = qr.first + done;  // relative to the segment
            const std::int64_t rows = std::min(kQueryTile, qr.length - done);
            const std::int64_t keys = first + rows;
            const std::int64_t local = qr.local + done;
            const std::int64_t offset = local * q_stride + h * hd;
            const float* q_tile = q.data() + offset;
            const float* o_tile = out.data() + offset;
            const float* do_tile = dout.data() + offset;
            float* dq_tile = dq.data() + offset;
            const float* lse_tile = lse.data() + h * nq + local;
            const int ir = static_cast<int>(rows);
            const int ik = static_cast<int>(keys);
            const int ihd = static_cast<int>(hd);
            const int iq = static_cast<int>(q_stride);
            const int ikv = static_cast<int>(kv_stride);

            // probs = exp(scale * q k^T - lse), zero above the diagonal
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ir, ik, ihd, scale, q_tile, iq,
                        k_seg, ikv, 0.0F, probs.data(), ik);
            for (std::int64_t r = 0; r < rows; ++r) {
              float* row = probs.data() + r * keys;
              const std::int64_t visible = first + r + 1;
              const float l = lse_tile[r];
              exp_shifted_row(row, visible, l);
              std::fill(row + visible, row + keys, 0.0F);
              float dot = 0.0F;  // D = sum(dout * out) for this query
#pragma omp simd reduction(+ : dot)
              for (std::int64_t d = 0; d < hd; ++d)
                dot += do_tile[r * q_stride + d] * o_tile[r * q_stride + d];
              row_dot[static_cast<std::size_t>(r)] = dot;
            }
            // dv (keys, hd) += probs^T (keys, rows) . dout (rows, hd)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ik, ihd, ir, 1.0F, probs.data(),
                        ik, do_tile, iq, 1.0F, dv_seg, ikv);
            // dprobs (rows, keys) = dout (rows, hd) . v^T (hd, keys)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ir, ik, ihd, 1.0F, do_tile, iq,
                        v_seg, ikv, 0.0F, dprobs.data(), ik);
            // dscores = probs * (dprobs - D), reusing dprobs
            for (std::int64_t r = 0; r < rows; ++r) {
              float* ds = dprobs.data() + r * keys;
              const float* p = probs.data() + r * keys;
              const float d = row_dot[static_cast<std::size_t>(r)];
#pragma omp simd
              for (std::int64_t j = 0; j < keys; ++j) ds[j] = p[j] * (ds[j] - d);
            }
            // dq (rows, hd) = scale * dscores (rows, keys) . k (keys, hd)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ir, ihd, ik, scale,
                        dprobs.data(), ik, k_seg, ikv, 0.0F, dq_tile, iq);
            // dk (keys, hd) += scale * dscores^T (keys, rows) . q (rows, hd)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ik, ihd, ir, scale, dprobs.data(),
                        ik, q_tile, iq, 1.0F, dk_seg, ikv);
          }
        }
      }
    }
  }
}

}  // namespace l3::kernels::cpu
