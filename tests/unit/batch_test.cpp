// Batch::validate: what reaches the kernels is checked on the host first (the GPU's embedding and
// loss kernels index their tables with these ids unchecked).
#include "model/batch.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"

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
