// Context parallelism's cut of a micro-batch (--context-parallel C): the C ranks of a group
// hold one whole batch between them. Each row of T tokens is cut into 2C chunks of T / 2C
// tokens; rank r holds chunks r and 2C - 1 - r of every row, so that each rank's queries see,
// under the causal mask, as many keys as any other's (Llama 3's load balancing).
#pragma once

#include <cstdint>
#include <vector>

#include "io/data/batch.hpp"

namespace l3::data {

// The tokens of a whole batch of `rows` rows of `row_tokens` that rank `rank` of `ranks` holds,
// ascending: (rows * 2 * chunk) indices into the whole, chunk = row_tokens / (2 * ranks).
[[nodiscard]] std::vector<std::int32_t> context_rows(std::int64_t rows, std::int64_t row_tokens,
                                                     int rank, int ranks);

// Rank `rank`'s share of `whole` (row_tokens a multiple of 2 * ranks): every per-token array
// taken at its context_rows, seq_len the share's tokens per row, cu_seqlens the whole's (the
// attention's keys, gathered from the group), document_tokens this rank's part of the whole's
// (an even split: the group adds up to the whole's) and context_document_tokens the whole's.
// Preference pairs keep their last tokens as the whole's indices.
[[nodiscard]] Batch context_share(const Batch& whole, int rank, int ranks);

}  // namespace l3::data
