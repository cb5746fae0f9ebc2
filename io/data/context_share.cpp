#include "io/data/context_share.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace l3::data {

std::vector<std::int32_t> context_rows(std::int64_t rows, std::int64_t row_tokens, int rank,
                                       int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks || row_tokens % (2 * ranks) != 0) {
    throw core::internal_error(
        fmt::format("context share: rank {} of {} of rows of {} tokens", rank, ranks, row_tokens));
  }
  const std::int64_t chunk = row_tokens / (2 * ranks);
  std::vector<std::int32_t> out;
  out.reserve(static_cast<std::size_t>(rows * 2 * chunk));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (const std::int64_t c : {std::int64_t{rank}, std::int64_t{2 * ranks - 1 - rank}}) {
      const std::int64_t first = r * row_tokens + c * chunk;
      for (std::int64_t t = 0; t < chunk; ++t) out.push_back(static_cast<std::int32_t>(first + t));
    }
  }
  return out;
}

namespace {

template <typename T>
std::vector<T> take(const std::vector<T>& whole, const std::vector<std::int32_t>& rows) {
  if (whole.empty()) return {};
  std::vector<T> out;
  out.reserve(rows.size());
  for (const std::int32_t t : rows) out.push_back(whole[static_cast<std::size_t>(t)]);
  return out;
}

}  // namespace

Batch context_share(const Batch& whole, int rank, int ranks) {
  if (!whole.context_rows.empty()) throw core::internal_error("context share of a share");
  Batch share;
  share.rows = whole.rows;
  share.seq_len = whole.seq_len / ranks;
  if (whole.rows == 0) {  // a batch of no rows stays one
    share.cu_seqlens = whole.cu_seqlens;
    return share;
  }
  share.context_rows = context_rows(whole.rows, whole.seq_len, rank, ranks);
  const std::vector<std::int32_t>& rows = share.context_rows;
  share.tokens = take(whole.tokens, rows);
  share.targets = take(whole.targets, rows);
  share.loss_mask = take(whole.loss_mask, rows);
  share.positions = take(whole.positions, rows);
  share.advantages = take(whole.advantages, rows);
  share.sampled_logprobs = take(whole.sampled_logprobs, rows);
  share.loss_weights = take(whole.loss_weights, rows);
  share.old_logprobs = take(whole.old_logprobs, rows);
  share.ref_logprobs = take(whole.ref_logprobs, rows);
  share.cu_seqlens = whole.cu_seqlens;
  share.completions = whole.completions;
  // The sequences' last tokens stay the whole's (a sequence spans the group's ranks).
  share.chosen_last = whole.chosen_last;
  share.rejected_last = whole.rejected_last;
  share.margins = whole.margins;
  share.pair_ids = whole.pair_ids;
  share.context_rank = rank;
  const std::int64_t d = whole.document_tokens;
  share.document_tokens = (rank + 1) * d / ranks - rank * d / ranks;
  share.context_document_tokens = d;
  return share;
}

}  // namespace l3::data
