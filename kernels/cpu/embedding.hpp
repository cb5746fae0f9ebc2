// Token embedding lookup and its gradient.
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

// The ids a table's rows are: [begin, begin + rows) of a vocabulary of `whole` ids (vocabulary
// parallelism; whole 0: the table is the whole vocabulary, begin 0).
struct TableRows {
  std::int64_t begin = 0;
  std::int64_t whole = 0;
};

// out (N, H) = table (V, H) rows selected by tokens (N). A token outside the vocabulary is an
// error; one of the vocabulary outside the table's rows (another rank's) gets a row of zeros.
void embedding(std::span<float> out, std::span<const std::int32_t> tokens,
               std::span<const float> table, std::int64_t hidden, TableRows ids = {});

// dtable (V, H) += dout (N, H) scattered by tokens. Deterministic: each thread owns a range of
// columns and visits the tokens in order, so repeated tokens add up in the same order. Tokens
// outside the table's rows add nothing.
void embedding_backward(std::span<float> dtable, std::span<const std::int32_t> tokens,
                        std::span<const float> dout, std::int64_t hidden, TableRows ids = {});

}  // namespace l3::kernels::cpu
