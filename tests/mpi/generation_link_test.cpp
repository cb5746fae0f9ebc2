// Asynchronous GRPO's weight transfer (train/grpo/generation_link.hpp, version_receiver.hpp):
// the training ranks' nonblocking VersionSends and a generating rank's VersionReceiver. The last
// rank generates, the others train, each owning a slice of a 2^20-value layout (4 MiB: past
// every MPI's eager limit, so a send completes only once it is received). Run with 2 and 3 ranks.
#include "train/grpo/generation_link.hpp"

#include <mpi.h>

#include <bit>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catch.hpp"
#include "dist/world.hpp"
#include "train/grpo/version_receiver.hpp"

namespace {

using l3::train::grpo::GenerationLink;
using l3::train::grpo::VersionReceiver;
using l3::train::grpo::VersionSends;
using l3::train::grpo::WeightPieces;
using l3::train::grpo::WireType;
using nlohmann::json;

constexpr std::int64_t kValues = std::int64_t{1} << 20;

// Version v's value at flat index i: exact in fp32; bf16 keeps 8 significant bits of it.
float value_of(std::int64_t version, std::int64_t i) {
  return static_cast<float>(version * 4 + (i % 1024)) + 0.5f;
}

// What arrives of it: bf16 rounds to nearest, ties to even (8 significant bits).
float arrived(float value, WireType type) {
  if (type == WireType::f32) return value;
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t rounded = (bits + 0x7FFFU + ((bits >> 16U) & 1U)) & 0xFFFF0000U;
  return std::bit_cast<float>(rounded);
}

// Training rank r's slice of the layout and its values for `version`.
WeightPieces slice_of(const GenerationLink& link, std::int64_t version) {
  const std::int64_t begin = kValues * link.rank / link.trainers;
  const std::int64_t end = kValues * (link.rank + 1) / link.trainers;
  WeightPieces pieces{.ranges = {{begin, end}}, .values = {}};
  for (std::int64_t i = begin; i < end; ++i) pieces.values.push_back(value_of(version, i));
  return pieces;
}

std::vector<int> generators(const GenerationLink& link) {
  std::vector<int> out;
  for (int g = 0; g < link.generators; ++g) out.push_back(link.first_generator() + g);
  return out;
}

// A training rank posts version v: rank 0 the control, every rank its slice.
std::unique_ptr<VersionSends> post(const GenerationLink& link, std::int64_t version,
                                   WireType type = WireType::f32) {
  auto sends = std::make_unique<VersionSends>(version);
  const std::vector<int> to = generators(link);
  if (link.rank == 0)
    sends->send_text(link.comm.get(), json{{"version", version}}.dump(), to,
                     l3::train::grpo::kControlTag);
  const WeightPieces slice = slice_of(link, version);
  const auto values = static_cast<std::int64_t>(slice.values.size());
  const std::int64_t bytes = sends->send_pieces(link.comm.get(), slice, to, type);
  // The values' bytes (4 or 2 each), to each generating rank.
  CHECK(bytes == link.generators * values * (type == WireType::bf16 ? 2 : 4));
  return sends;
}

void check_version(const VersionReceiver::Version& v, std::int64_t version,
                   WireType type = WireType::f32) {
  REQUIRE_FALSE(v.stop);
  CHECK(json::parse(v.control).at("version").get<std::int64_t>() == version);
  REQUIRE(static_cast<std::int64_t>(v.weights.size()) == kValues);
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < kValues; ++i)
    wrong += v.weights[static_cast<std::size_t>(i)] != arrived(value_of(version, i), type) ? 1 : 0;
  CHECK(wrong == 0);
  CHECK(v.bytes == kValues * (type == WireType::bf16 ? 2 : 4));
}

void send_stop(const GenerationLink& link) {
  if (link.rank != 0) return;
  for (const int g : generators(link))
    l3::train::grpo::send_text(link.comm.get(), json{{"stop", true}, {"stopped", false}}.dump(), g,
                               l3::train::grpo::kControlTag);
}

}  // namespace

TEST_CASE("the generating rank receives each version while it computes", "[generation_link]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  REQUIRE(world.size() >= 2);
  if (world.thread_level() != MPI_THREAD_MULTIPLE) {
    WARN("MPI_THREAD_MULTIPLE not provided: the receipt runs inline (the next test)");
    return;
  }
  const l3::train::grpo::SplitWorld split = l3::train::grpo::split_for_generation(world, 1);
  const GenerationLink& link = *split.link;
  if (link.generating()) {
    VersionReceiver receiver(link, kValues, WireType::f32, true);
    REQUIRE(receiver.background());
    check_version(receiver.take(), 0);
    receiver.release();
    // Busy elsewhere (in a barrier the training ranks reach only once version 1's sends are
    // complete): only the receiver's thread can take version 1 meanwhile.
    MPI_Barrier(world.comm());
    const VersionReceiver::Version v1 = receiver.take();
    check_version(v1, 1);
    CHECK(v1.transfer_ms >= 0.0);
    receiver.release();
    check_version(receiver.take(), 2);
    receiver.release();
    CHECK(receiver.take().stop);
  } else {
    post(link, 0)->complete();
    post(link, 1)->complete();  // received while the generating rank waits in the barrier
    MPI_Barrier(world.comm());
    auto v2 = post(link, 2);
    send_stop(link);  // behind version 2 on the wire: the receiver takes it after
    v2->complete();
  }
}

TEST_CASE("without its thread, the receiver takes the same versions in the same order",
          "[generation_link]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const l3::train::grpo::SplitWorld split = l3::train::grpo::split_for_generation(world, 1);
  const GenerationLink& link = *split.link;
  if (link.generating()) {
    VersionReceiver receiver(link, kValues, WireType::f32, false);
    CHECK_FALSE(receiver.background());
    for (std::int64_t v = 0; v < 3; ++v) {
      check_version(receiver.take(), v);
      receiver.release();
    }
    CHECK(receiver.take().stop);
  } else {
    // Three versions in flight at once: nonblocking, they wait for the receiver in order.
    std::vector<std::unique_ptr<VersionSends>> sent;
    for (std::int64_t v = 0; v < 3; ++v) sent.push_back(post(link, v));
    send_stop(link);
    for (auto& s : sent) s->complete();
  }
}

TEST_CASE("a receiver waiting for a version that never comes stops at once when destroyed",
          "[generation_link]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  if (world.thread_level() != MPI_THREAD_MULTIPLE) return;
  const l3::train::grpo::SplitWorld split = l3::train::grpo::split_for_generation(world, 1);
  const GenerationLink& link = *split.link;
  if (link.generating()) {
    {
      // Its thread waits for a control; destroyed, it cancels that receipt and joins (a hang
      // here is the failure), so nothing is left to take a later message.
      const VersionReceiver receiver(link, kValues, WireType::f32, true);
    }
    MPI_Barrier(world.comm());
    VersionReceiver receiver(link, kValues, WireType::f32, true);
    check_version(receiver.take(), 7);
    receiver.release();
    CHECK(receiver.take().stop);
  } else {
    MPI_Barrier(world.comm());  // the first receiver is gone: version 7 goes to the second
    auto v7 = post(link, 7);
    send_stop(link);
    v7->complete();
  }
}

TEST_CASE("weights in bf16 arrive rounded to nearest even, in half the bytes",
          "[generation_link]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const l3::train::grpo::SplitWorld split = l3::train::grpo::split_for_generation(world, 1);
  const GenerationLink& link = *split.link;
  const bool background = world.thread_level() == MPI_THREAD_MULTIPLE;
  if (link.generating()) {
    VersionReceiver receiver(link, kValues, WireType::bf16, background);
    const VersionReceiver::Version v = receiver.take();
    check_version(v, 3, WireType::bf16);
    // 1024 distinct values from 12.5 to 1035.5: past 256 most are not bf16 numbers.
    std::int64_t changed = 0;
    for (std::int64_t i = 0; i < 1024; ++i)
      changed += v.weights[static_cast<std::size_t>(i)] != value_of(3, i) ? 1 : 0;
    CHECK(changed > 700);
    receiver.release();
    CHECK(receiver.take().stop);
  } else {
    auto v3 = post(link, 3, WireType::bf16);
    send_stop(link);
    v3->complete();
  }
}
