#include "train/grpo/prompt_set.hpp"

#include <fmt/format.h>

#include <exception>
#include <utility>

#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "io/data/shard_format.hpp"

namespace l3::train::grpo {

PromptSet PromptSet::load(const dist::World& world, const data::DatasetIndex& index) {
  PromptSet set;
  set.directory_ = index.directory;
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      for (const data::ShardEntry& entry : index.shards) {
        const data::PromptShard shard = data::read_prompt_shard(entry.path);
        const data::Prompts& p = shard.prompts;
        const auto token_base = static_cast<std::int64_t>(set.tokens_.size());
        const auto record_base = static_cast<std::int64_t>(set.records_.size());
        for (const std::uint32_t id : p.documents.tokens) {
          if (std::cmp_greater_equal(id, index.vocab_size)) {
            throw core::bad_input(fmt::format("token id {} is not below the vocabulary size {}", id,
                                              index.vocab_size),
                                  {.file = entry.path, .tensor = "/tokens"});
          }
          set.tokens_.push_back(static_cast<std::int32_t>(id));
        }
        for (std::size_t d = 1; d < p.documents.offsets.size(); ++d) {
          set.offsets_.push_back(token_base + p.documents.offsets[d]);
          set.record_offsets_.push_back(record_base + p.record_offsets[d]);
        }
        set.records_ += p.records;
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
  dist::broadcast_vector(world.comm(), set.tokens_);
  dist::broadcast_vector(world.comm(), set.offsets_);
  dist::broadcast_vector(world.comm(), set.record_offsets_);
  set.records_ = dist::broadcast_string(world.comm(), set.records_);
  return set;
}

void PromptSet::share(MPI_Comm comm, int root) {
  directory_ = dist::broadcast_string(comm, directory_, root);
  dist::broadcast_vector(comm, tokens_, root);
  dist::broadcast_vector(comm, offsets_, root);
  dist::broadcast_vector(comm, record_offsets_, root);
  records_ = dist::broadcast_string(comm, records_, root);
}

std::span<const std::int32_t> PromptSet::prompt(std::int64_t i) const {
  const auto k = static_cast<std::size_t>(i);
  return std::span<const std::int32_t>(tokens_).subspan(
      static_cast<std::size_t>(offsets_[k]),
      static_cast<std::size_t>(offsets_[k + 1] - offsets_[k]));
}

std::string_view PromptSet::record(std::int64_t i) const {
  const auto k = static_cast<std::size_t>(i);
  return std::string_view(records_).substr(
      static_cast<std::size_t>(record_offsets_[k]),
      static_cast<std::size_t>(record_offsets_[k + 1] - record_offsets_[k]));
}

}  // namespace l3::train::grpo
