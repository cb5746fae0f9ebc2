#include "train/grpo/generation_link.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "dist/point_to_point.hpp"

namespace l3::train::grpo {

SplitWorld split_for_generation(const dist::World& world, std::int64_t generation_ranks) {
  if (generation_ranks >= world.size()) {
    throw core::usage_error(fmt::format(
        "--generation-ranks {} leaves no rank to train: the job has {} rank{} (the first "
        "ranks train, the last --generation-ranks generate)",
        generation_ranks, world.size(), world.size() == 1 ? "" : "s"));
  }
  SplitWorld split;
  split.link = std::make_unique<GenerationLink>();
  GenerationLink& link = *split.link;
  link.comm = world.duplicate_comm();
  link.generators = static_cast<int>(generation_ranks);
  link.trainers = world.size() - link.generators;
  link.rank = world.rank();
  split.group = world.split(link.generating() ? 1 : 0, world.rank());
  return split;
}

void send_text(MPI_Comm comm, const std::string& text, int destination, int tag) {
  const auto length = static_cast<std::int64_t>(text.size());
  dist::send_value(comm, length, destination, tag, "a message's length");
  dist::send(comm, std::span<const char>(text.data(), text.size()), destination, tag, "a message");
}

std::string receive_text(MPI_Comm comm, int source, int tag) {
  const auto length = dist::receive_value<std::int64_t>(comm, source, tag, "a message's length");
  std::string text(static_cast<std::size_t>(length), '\0');
  dist::receive(comm, std::span<char>(text.data(), text.size()), source, tag, "a message");
  return text;
}

void send_pieces(MPI_Comm comm, const WeightPieces& pieces, int destination) {
  std::vector<std::int64_t> ranges;
  ranges.reserve(2 * pieces.ranges.size());
  for (const model::FlatRange& r : pieces.ranges) {
    ranges.push_back(r.begin);
    ranges.push_back(r.end);
  }
  const auto count = static_cast<std::int64_t>(ranges.size());
  dist::send_value(comm, count, destination, kWeightsTag, "weight ranges");
  dist::send(comm, std::span<const std::int64_t>(ranges), destination, kWeightsTag,
             "weight ranges");
  dist::send(comm, std::span<const float>(pieces.values), destination, kWeightsTag, "weights");
}

std::int64_t receive_pieces(MPI_Comm comm, int source, std::span<float> whole) {
  const auto count = dist::receive_value<std::int64_t>(comm, source, kWeightsTag, "weight ranges");
  std::vector<std::int64_t> ranges(static_cast<std::size_t>(count));
  dist::receive(comm, std::span<std::int64_t>(ranges), source, kWeightsTag, "weight ranges");
  std::int64_t values = 0;
  for (std::size_t i = 0; i + 1 < ranges.size(); i += 2) {
    if (ranges[i] < 0 || ranges[i] > ranges[i + 1] ||
        ranges[i + 1] > static_cast<std::int64_t>(whole.size()))
      throw core::internal_error("asynchronous GRPO: weight ranges outside the layout");
    values += ranges[i + 1] - ranges[i];
  }
  std::vector<float> received(static_cast<std::size_t>(values));
  dist::receive(comm, std::span<float>(received), source, kWeightsTag, "weights");
  std::size_t at = 0;
  for (std::size_t i = 0; i + 1 < ranges.size(); i += 2) {
    const auto n = static_cast<std::size_t>(ranges[i + 1] - ranges[i]);
    std::copy_n(received.begin() + static_cast<std::ptrdiff_t>(at), n,
                whole.begin() + static_cast<std::ptrdiff_t>(ranges[i]));
    at += n;
  }
  return values * static_cast<std::int64_t>(sizeof(float)) +
         count * static_cast<std::int64_t>(sizeof(std::int64_t));
}

}  // namespace l3::train::grpo
