// Asynchronous GRPO's two groups of ranks and the messages between them. The world splits into
// training ranks (the first ones: rank 0, which writes the outputs, trains) and generating ranks
// (the last --generation-ranks). Each group gets a World of its own for its collectives; the
// link is a private duplicate of the whole world for what crosses between them:
//   setup    training rank 0 -> each generating rank: the run's facts (JSON); then, with LoRA,
//            every training rank's pieces of the frozen base (fp32; its share with
//            --shard-parameters); then the prompts, broadcast over the link (collective)
//   control  training rank 0 -> each generating rank: {"version": v, "batches": [j, ...]} (the
//            policy after v steps follows; generate these steps' batches with it) or
//            {"stop": true, "stopped": bool} (the run ends; stopped: by a signal or deadline)
//   weights  every training rank -> each generating rank, after a control with a version: the
//            master weights of the ranges it owns (the trainable layout: the adapters with
//            LoRA), whatever the ZeRO stage, in the backend's compute dtype (WireType: fp32 on
//            the CPU, bf16 rounded to nearest even on CUDA, what the generating rank's model
//            rounds them to anyway: half the bytes, the same weights)
//   batch    the first generating rank -> training rank 0: a step's generation batch as the
//            rollout cache stores it (train/grpo/rollout_cache.hpp), or {"error": ...}
// Both sides follow one order (rollout_link.cpp, generation_worker.cpp), so that what is sent
// never depends on timing. A version's control and weights go as nonblocking sends (VersionSends:
// the training ranks go on training), and each generating rank receives them on a thread of its
// own (VersionReceiver) into a staging buffer while its model generates with the version before;
// the batches go as nonblocking sends too. The setup and the stop are blocking sends.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dist/communicator.hpp"
#include "dist/request.hpp"
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
// The same, for a thread whose owner may call the receipt off: `stop` is polled while waiting
// (short sleeps, no spinning core); nullopt once it is set.
[[nodiscard]] std::optional<std::string> receive_text(MPI_Comm comm, int source, int tag,
                                                      const std::atomic<bool>& stop);

// How the weights travel: fp32, or rounded to bf16 (nearest even) and widened back on arrival.
enum class WireType : std::uint8_t { f32, bf16 };
[[nodiscard]] std::string_view to_string(WireType type) noexcept;
// "f32" or "bf16" (the setup's "weights_dtype"); internal_error otherwise.
[[nodiscard]] WireType wire_type_from(std::string_view name);

// Values of some ranges of a flat layout (a rank's pieces of the weights).
struct WeightPieces {
  std::vector<model::FlatRange> ranges;
  std::vector<float> values;  // the ranges' values, one after the other
};
void send_pieces(MPI_Comm comm, const WeightPieces& pieces, int destination);
// Received from `source` into `whole` (the layout's values, at the ranges' offsets); returns the
// values' bytes received. internal_error when a range falls outside `whole`. With `stop`: as
// receive_text's, nullopt when called off.
std::int64_t receive_pieces(MPI_Comm comm, int source, std::span<float> whole,
                            WireType type = WireType::f32);
[[nodiscard]] std::optional<std::int64_t> receive_pieces(MPI_Comm comm, int source,
                                                         std::span<float> whole, WireType type,
                                                         const std::atomic<bool>& stop);

// One policy version's messages from a training rank (rank 0: the control too), as nonblocking
// sends from buffers held here until they complete: the rank goes on training meanwhile. (A
// generating rank sends its batches the same way, one step's batch as the text.)
class VersionSends {
 public:
  explicit VersionSends(std::int64_t version);
  // Incomplete sends (an error's way out, the generating ranks gone) are handed to MPI, their
  // buffers kept until the process ends: MPI may still read them.
  ~VersionSends();
  VersionSends(const VersionSends&) = delete;
  VersionSends& operator=(const VersionSends&) = delete;
  VersionSends(VersionSends&&) = delete;
  VersionSends& operator=(VersionSends&&) = delete;

  // The control text to each of `destinations` (send_text's framing).
  void send_text(MPI_Comm comm, std::string text, std::span<const int> destinations, int tag);
  // The pieces to each of `destinations` (send_pieces's framing, the values as `type`); returns
  // the values' bytes sent.
  std::int64_t send_pieces(MPI_Comm comm, WeightPieces pieces, std::span<const int> destinations,
                           WireType type);
  // Returns once every send is complete (their destinations received them).
  void complete();
  // Whether every send is complete, without waiting.
  [[nodiscard]] bool done();
  [[nodiscard]] std::int64_t version() const noexcept { return version_; }

 private:
  struct Buffers {
    std::int64_t text_length = 0;
    std::string text;
    std::int64_t range_count = 0;
    std::vector<std::int64_t> ranges;
    std::vector<float> values;
    std::vector<std::uint16_t> halves;  // the values as bf16 (WireType::bf16)
  };
  std::int64_t version_;
  std::unique_ptr<Buffers> buffers_ = std::make_unique<Buffers>();
  std::vector<dist::Request> requests_;
};

}  // namespace l3::train::grpo
