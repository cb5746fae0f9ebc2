// Asynchronous GRPO's two groups of ranks and the messages between them. The world splits into
// training ranks (the first ones: rank 0, which writes the outputs, trains) and generating ranks
// (the last --generation-ranks). Each group gets a World of its own for its collectives; the
// link is a private duplicate of the whole world for what crosses between them:
//   setup    training rank 0 -> each generating rank: the run's facts (JSON), then, with LoRA,
//            the frozen base weights; then the prompts, broadcast over the link (collective)
//   control  training rank 0 -> each generating rank: {"version": v, "batches": [j, ...]} (the
//            policy after v steps follows; generate these steps' batches with it) or
//            {"stop": true, "stopped": bool} (the run ends; stopped: by a signal or deadline)
//   weights  every training rank -> each generating rank, after a control with a version: the
//            fp32 master weights of the ranges it owns (the trainable layout: the adapters with
//            LoRA), whatever the ZeRO stage
//   batch    the first generating rank -> training rank 0: a step's generation batch as the
//            rollout cache stores it (train/grpo/rollout_cache.hpp), or {"error": ...}
// Every message is a blocking send matched by a blocking receive, in an order both sides
// follow (generation_worker.cpp, rollout_source.cpp), so that nothing depends on timing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dist/communicator.hpp"
#include "dist/world.hpp"
#include "model/parameter_layout.hpp"

namespace l3::train::grpo {

struct GenerationLink {
  dist::UniqueComm comm;  // over the whole world, in its rank order
  int trainers = 0;       // ranks [0, trainers) train
  int generators = 0;     // ranks [trainers, trainers + generators) generate
  int rank = 0;           // this rank's, in comm
  [[nodiscard]] bool generating() const noexcept { return rank >= trainers; }
  [[nodiscard]] int first_generator() const noexcept { return trainers; }
};

// A world split for --generation-ranks: the link and this rank's group.
struct SplitWorld {
  std::unique_ptr<GenerationLink> link;
  std::optional<dist::World> group;
};

// Collective over `world`. usage Error when `generation_ranks` leaves no rank to train.
[[nodiscard]] SplitWorld split_for_generation(const dist::World& world,
                                              std::int64_t generation_ranks);

enum LinkTag : int { kSetupTag = 7101, kControlTag = 7102, kWeightsTag = 7103, kBatchTag = 7104 };

// A text message: its length, then its bytes.
void send_text(MPI_Comm comm, const std::string& text, int destination, int tag);
[[nodiscard]] std::string receive_text(MPI_Comm comm, int source, int tag);

// Values of some ranges of a flat layout (a rank's pieces of the weights).
struct WeightPieces {
  std::vector<model::FlatRange> ranges;
  std::vector<float> values;  // the ranges' values, one after the other
};
void send_pieces(MPI_Comm comm, const WeightPieces& pieces, int destination);
// Received from `source` into `whole` (the layout's values, at the ranges' offsets); returns the
// bytes received. bad_input when a range falls outside `whole`.
std::int64_t receive_pieces(MPI_Comm comm, int source, std::span<float> whole);

}  // namespace l3::train::grpo
