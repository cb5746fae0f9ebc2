// Batch::validate: what reaches the kernels is checked on the host first (the GPU's embedding and
// loss kernels index their tables with these ids unchecked).
#include "model/batch.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "io/data/context_share.hpp"

using l3::model::Batch;
using l3::model::BatchBuilder;

namespace {

Batch two_documents() {
  BatchBuilder builder(1, 8, 0);
  builder.add({5, 6, 7}, {0, 1, 1});
  builder.add({8, 9}, {0, 1});
  return builder.finish();
}

}  // namespace

TEST_CASE("batch validation: token and counted target ids below the vocabulary size", "[model]") {
  const std::int64_t vocab = 10;
  Batch batch = two_documents();
  CHECK_NOTHROW(batch.validate(vocab));

  SECTION("a counted target out of range is bad input naming it") {
    REQUIRE(batch.loss_mask[1] != 0);
    batch.targets[1] = 10;
    CHECK_THROWS_AS(batch.validate(vocab), l3::core::Error);
    try {
      batch.validate(vocab);
    } catch (const l3::core::Error& e) {
      CHECK(e.exit_code() == 2);
      CHECK(std::string(e.what()).find("target id 10 at position 1") != std::string::npos);
    }
    batch.targets[1] = -1;
    CHECK_THROWS_AS(batch.validate(vocab), l3::core::Error);
  }
  SECTION("a target that counts nothing is not read") {
    const auto last = batch.targets.size() - 1;  // padding
    REQUIRE(batch.loss_mask[last] == 0);
    batch.targets[last] = 1000;
    CHECK_NOTHROW(batch.validate(vocab));
  }
  SECTION("a token out of range is bad input") {
    batch.tokens[0] = 10;
    CHECK_THROWS_AS(batch.validate(vocab), l3::core::Error);
  }
}

TEST_CASE("a packed row is cut after its last document, rounded up to the alignment", "[model]") {
  BatchBuilder builder(1, 40, 3);
  CHECK(builder.add({5, 6, 7}, {0, 1, 1}) == 2);
  CHECK(builder.add({8, 9, 4, 4, 4}, {0, 0, 1, 1, 1}) == 7);
  CHECK(builder.add({1, 2}, {0, 1}) == 9);
  const Batch packed = builder.finish_packed(4);  // 10 tokens: a row of 12
  CHECK(packed.rows == 1);
  CHECK(packed.seq_len == 12);
  CHECK(packed.tokens_count() == 12);
  CHECK(packed.document_tokens == 10);
  CHECK(packed.cu_seqlens == std::vector<std::int32_t>{0, 3, 8, 10, 12});
  CHECK(packed.positions == std::vector<std::int32_t>{0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 0, 1});
  CHECK(packed.targets == std::vector<std::int32_t>{6, 7, 3, 9, 4, 4, 4, 3, 2, 3, 3, 3});
  CHECK(packed.loss_mask == std::vector<std::uint8_t>{1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0});
  CHECK(packed.longest_segment() == 5);
  CHECK_NOTHROW(packed.validate(10));

  // Exactly aligned: no padding segment; never longer than the capacity it was built with.
  BatchBuilder whole(1, 6, 0);
  whole.add({1, 2, 3, 4}, {0, 1, 1, 1});
  const Batch exact = whole.finish_packed(4);
  CHECK(exact.seq_len == 4);
  CHECK(exact.cu_seqlens == std::vector<std::int32_t>{0, 4});
  BatchBuilder near_full(1, 6, 0);
  near_full.add({1, 2, 3, 4, 5}, {0, 1, 1, 1, 1});
  CHECK(near_full.finish_packed(4).seq_len == 6);
  BatchBuilder rows(2, 6, 0);
  CHECK_THROWS_AS(rows.finish_packed(4), l3::core::Error);
  // A document that does not fit leaves the row open: the pass is cut after what did fit.
  BatchBuilder full(1, 8, 0);
  CHECK(full.add({1, 2, 3, 4, 5}, {0, 1, 1, 1, 1}) == 4);
  CHECK(full.add({6, 7, 8, 9}, {0, 1, 1, 1}) == -1);
  const Batch cut = full.finish_packed(2);
  CHECK(cut.seq_len == 6);
  CHECK(cut.cu_seqlens == std::vector<std::int32_t>{0, 5, 6});
}

TEST_CASE("a context-parallel share: chunks r and 2C - 1 - r of every row", "[model][context]") {
  // Two rows of 8 tokens: documents of 3, 4 (then padding) and 8 tokens.
  BatchBuilder builder(2, 8, 0);
  builder.add({1, 2, 3}, {0, 1, 1});
  builder.add({4, 5, 6, 7}, {0, 1, 1, 1});
  builder.end_row();
  builder.add({8, 9, 10, 11, 12, 13, 14, 15}, {0, 1, 1, 1, 1, 1, 1, 1});
  const Batch whole = builder.finish();
  CHECK(l3::data::context_rows(2, 8, 0, 2) == std::vector<std::int32_t>{0, 1, 6, 7, 8, 9, 14, 15});
  CHECK(l3::data::context_rows(2, 8, 1, 2) ==
        std::vector<std::int32_t>{2, 3, 4, 5, 10, 11, 12, 13});
  std::int64_t documents = 0;
  std::int64_t counted = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const Batch share = l3::data::context_share(whole, rank, 2);
    share.validate(16);
    CHECK(share.rows == 2);
    CHECK(share.seq_len == 4);
    CHECK(share.cu_seqlens == whole.cu_seqlens);  // the whole's segments: the attention's keys
    CHECK(share.context_document_tokens == whole.document_tokens);
    for (std::size_t i = 0; i < share.tokens.size(); ++i) {
      const auto t = static_cast<std::size_t>(share.context_rows[i]);
      CHECK(share.tokens[i] == whole.tokens[t]);
      CHECK(share.targets[i] == whole.targets[t]);
      CHECK(share.positions[i] == whole.positions[t]);
      CHECK(share.loss_mask[i] == whole.loss_mask[t]);
    }
    documents += share.document_tokens;
    counted += share.counted_tokens();
  }
  CHECK(documents == whole.document_tokens);
  CHECK(counted == whole.counted_tokens());
  // Rows that do not cut into 2C chunks and a share of a share are refused.
  CHECK_THROWS(l3::data::context_share(whole, 0, 3));
  const Batch share = l3::data::context_share(whole, 0, 2);
  CHECK_THROWS(l3::data::context_share(share, 0, 2));
  Batch bad = share;
  bad.positions[1] = 0;  // not its index in its segment
  CHECK_THROWS(bad.validate(16));
}
