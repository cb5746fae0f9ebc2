// GRPO's prompts (a dataset made by `prep prompts`) in memory on every rank: each prompt's ids
// and its record (the JSON object it came from: "answer", test cases, ... for the rewards).
// Rank 0 reads the shards and broadcasts them: prompts are small (a few hundred tokens and a
// record each), and the rollout of a step may give any rank any prompt.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dist/world.hpp"
#include "io/data/dataset_index.hpp"

namespace l3::train::grpo {

class PromptSet {
 public:
  PromptSet() = default;
  // Collective over `world`: the prompts of `index` (a prompt dataset), in sample order.
  // bad_input Errors name the shard.
  static PromptSet load(const dist::World& world, const data::DatasetIndex& index);
  // Collective over `comm`: `root`'s set on every rank (asynchronous GRPO: the training ranks
  // loaded it, the generating ranks take theirs).
  void share(MPI_Comm comm, int root);

  [[nodiscard]] std::int64_t size() const noexcept {
    return static_cast<std::int64_t>(offsets_.size()) - 1;
  }
  [[nodiscard]] std::span<const std::int32_t> prompt(std::int64_t i) const;
  [[nodiscard]] std::string_view record(std::int64_t i) const;
  [[nodiscard]] const std::string& directory() const noexcept { return directory_; }

 private:
  std::string directory_;
  std::vector<std::int32_t> tokens_;
  std::vector<std::int64_t> offsets_{0};
  std::string records_;
  std::vector<std::int64_t> record_offsets_{0};
};

}  // namespace l3::train::grpo
