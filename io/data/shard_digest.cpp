// The content digest of a shard: what identifies its samples for tables computed from them
// (DPO's reference log-probabilities), whatever its file's name or place.
#include <fmt/format.h>
#include <xxhash.h>

#include <memory>
#include <span>

#include "core/error.hpp"
#include "io/data/shard_format.hpp"

namespace l3::data {

namespace {

class Digest {
 public:
  Digest() : state_(XXH64_createState(), XXH64_freeState) {
    if (!state_ || XXH64_reset(state_.get(), 0) != XXH_OK)
      throw core::internal_error("XXH64: cannot start a digest");
  }
  template <typename T>
  void add(std::span<const T> values) {
    // The count first: the arrays' boundaries are part of the content.
    const auto count = static_cast<std::uint64_t>(values.size());
    XXH64_update(state_.get(), &count, sizeof(count));
    XXH64_update(state_.get(), values.data(), values.size_bytes());
  }
  void add(const Documents& d) {
    add<std::uint32_t>(d.tokens);
    add<std::uint8_t>(d.loss_mask);
    add<std::int64_t>(d.offsets);
  }
  [[nodiscard]] std::string hex() const {
    return fmt::format("{:016x}", XXH64_digest(state_.get()));
  }

 private:
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> state_;
};

}  // namespace

std::string content_digest(const Documents& documents) {
  Digest d;
  d.add(documents);
  return d.hex();
}

std::string content_digest(const PreferencePairs& pairs) {
  Digest d;
  d.add(pairs.chosen);
  d.add(pairs.rejected);
  if (pairs.has_margin) d.add<float>(pairs.margins);
  return d.hex();
}

std::string content_digest(const Prompts& prompts) {
  Digest d;
  d.add(prompts.documents);
  d.add<char>(prompts.records);
  d.add<std::int64_t>(prompts.record_offsets);
  return d.hex();
}

}  // namespace l3::data
