#include "train/grpo/generation_link.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.hpp"
#include "dist/point_to_point.hpp"
#include "dist/request.hpp"
#include "io/safetensors/float_formats.hpp"

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

namespace {

// How long a polling receipt may sleep between two polls: the first message of a version comes
// when the training ranks end a step, a long wait, polled every 2 ms at most (the waiting thread
// takes next to nothing from the computing one on a shared core, and 2 ms is far less than a
// step); the messages after it are on their way, and each poll moves them on (50 us).
enum class Expect : std::uint8_t { later, now };

// Receives `data` from `source` (dist::receive), or with `stop`: polls the receipt with sleeps
// between polls and calls it off once `stop` is set (false then).
template <dist::MpiValue T>
bool receive_part(MPI_Comm comm, std::span<T> data, int source, int tag, std::string_view what,
                  const std::atomic<bool>* stop, Expect expect = Expect::now) {
  if (stop == nullptr) {
    dist::receive(comm, data, source, tag, what);
    return true;
  }
  dist::Request request = dist::start_receive(comm, data, source, tag, what);
  const std::chrono::microseconds longest{expect == Expect::later ? 2000 : 50};
  std::chrono::microseconds pause{10};
  while (!request.test(what)) {
    if (stop->load(std::memory_order_acquire)) {
      request.cancel(what);
      return false;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, longest);
  }
  return true;
}

std::optional<std::string> receive_text_part(MPI_Comm comm, int source, int tag,
                                             const std::atomic<bool>* stop) {
  std::int64_t length = 0;
  if (!receive_part(comm, std::span<std::int64_t>(&length, 1), source, tag, "a message's length",
                    stop, Expect::later))
    return std::nullopt;
  std::string text(static_cast<std::size_t>(length), '\0');
  if (!receive_part(comm, std::span<char>(text.data(), text.size()), source, tag, "a message",
                    stop))
    return std::nullopt;
  return text;
}

std::optional<std::int64_t> receive_pieces_part(MPI_Comm comm, int source, std::span<float> whole,
                                                WireType type, const std::atomic<bool>* stop) {
  std::int64_t count = 0;
  if (!receive_part(comm, std::span<std::int64_t>(&count, 1), source, kWeightsTag, "weight ranges",
                    stop))
    return std::nullopt;
  std::vector<std::int64_t> ranges(static_cast<std::size_t>(count));
  if (!receive_part(comm, std::span<std::int64_t>(ranges), source, kWeightsTag, "weight ranges",
                    stop))
    return std::nullopt;
  std::int64_t values = 0;
  for (std::size_t i = 0; i + 1 < ranges.size(); i += 2) {
    if (ranges[i] < 0 || ranges[i] > ranges[i + 1] ||
        ranges[i + 1] > static_cast<std::int64_t>(whole.size()))
      throw core::internal_error("asynchronous GRPO: weight ranges outside the layout");
    values += ranges[i + 1] - ranges[i];
  }
  std::vector<float> received(static_cast<std::size_t>(values));
  std::int64_t value_bytes = values * static_cast<std::int64_t>(sizeof(float));
  if (type == WireType::bf16) {
    // 16 bits a value, as raw bytes; widened exactly to fp32.
    std::vector<std::byte> halves(static_cast<std::size_t>(values) * 2);
    if (!receive_part(comm, std::span<std::byte>(halves), source, kWeightsTag, "weights (bf16)",
                      stop))
      return std::nullopt;
    for (std::size_t i = 0; i < received.size(); ++i) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, halves.data() + 2 * i, 2);
      received[i] = safetensors::bf16_to_float(bits);
    }
    value_bytes = values * 2;
  } else if (!receive_part(comm, std::span<float>(received), source, kWeightsTag, "weights",
                           stop)) {
    return std::nullopt;
  }
  std::size_t at = 0;
  for (std::size_t i = 0; i + 1 < ranges.size(); i += 2) {
    const auto n = static_cast<std::size_t>(ranges[i + 1] - ranges[i]);
    std::copy_n(received.begin() + static_cast<std::ptrdiff_t>(at), n,
                whole.begin() + static_cast<std::ptrdiff_t>(ranges[i]));
    at += n;
  }
  return value_bytes;
}

}  // namespace

std::string_view to_string(WireType type) noexcept {
  return type == WireType::bf16 ? "bf16" : "f32";
}

WireType wire_type_from(std::string_view name) {
  if (name == "f32") return WireType::f32;
  if (name == "bf16") return WireType::bf16;
  throw core::internal_error(
      fmt::format("asynchronous GRPO: weights of an unknown type '{}' on the wire", name));
}

void send_text(MPI_Comm comm, const std::string& text, int destination, int tag) {
  const auto length = static_cast<std::int64_t>(text.size());
  dist::send_value(comm, length, destination, tag, "a message's length");
  dist::send(comm, std::span<const char>(text.data(), text.size()), destination, tag, "a message");
}

std::string receive_text(MPI_Comm comm, int source, int tag) {
  return *receive_text_part(comm, source, tag, nullptr);
}

std::optional<std::string> receive_text(MPI_Comm comm, int source, int tag,
                                        const std::atomic<bool>& stop) {
  return receive_text_part(comm, source, tag, &stop);
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

std::int64_t receive_pieces(MPI_Comm comm, int source, std::span<float> whole, WireType type) {
  return *receive_pieces_part(comm, source, whole, type, nullptr);
}

std::optional<std::int64_t> receive_pieces(MPI_Comm comm, int source, std::span<float> whole,
                                           WireType type, const std::atomic<bool>& stop) {
  return receive_pieces_part(comm, source, whole, type, &stop);
}

VersionSends::VersionSends(std::int64_t version) : version_(version) {}

VersionSends::~VersionSends() {
  const bool pending = std::any_of(requests_.begin(), requests_.end(),
                                   [](const dist::Request& r) { return r.active(); });
  if (!pending) return;
  // The Requests free themselves (MPI_Request_free); the buffers stay with the process.
  static std::mutex kept_mutex;
  static std::vector<std::unique_ptr<Buffers>> kept;
  const std::scoped_lock lock(kept_mutex);
  kept.push_back(std::move(buffers_));
}

void VersionSends::send_text(MPI_Comm comm, std::string text, std::span<const int> destinations,
                             int tag) {
  Buffers& b = *buffers_;
  b.text = std::move(text);
  b.text_length = static_cast<std::int64_t>(b.text.size());
  for (const int d : destinations) {
    requests_.push_back(dist::start_send(comm, std::span<const std::int64_t>(&b.text_length, 1), d,
                                         tag, "a message's length"));
    requests_.push_back(dist::start_send(comm, std::span<const char>(b.text.data(), b.text.size()),
                                         d, tag, "a message"));
  }
}

std::int64_t VersionSends::send_pieces(MPI_Comm comm, WeightPieces pieces,
                                       std::span<const int> destinations, WireType type) {
  Buffers& b = *buffers_;
  b.ranges.clear();
  for (const model::FlatRange& r : pieces.ranges) {
    b.ranges.push_back(r.begin);
    b.ranges.push_back(r.end);
  }
  b.range_count = static_cast<std::int64_t>(b.ranges.size());
  b.values = std::move(pieces.values);
  std::size_t value_bytes = b.values.size() * sizeof(float);
  if (type == WireType::bf16) {
    b.halves.resize(b.values.size());
    std::transform(b.values.begin(), b.values.end(), b.halves.begin(), safetensors::float_to_bf16);
    b.values = {};
    value_bytes = b.halves.size() * 2;
  }
  for (const int d : destinations) {
    requests_.push_back(dist::start_send(comm, std::span<const std::int64_t>(&b.range_count, 1), d,
                                         kWeightsTag, "weight ranges"));
    requests_.push_back(dist::start_send(comm, std::span<const std::int64_t>(b.ranges), d,
                                         kWeightsTag, "weight ranges"));
    if (type == WireType::bf16) {
      requests_.push_back(dist::start_send(comm,
                                           std::as_bytes(std::span<const std::uint16_t>(b.halves)),
                                           d, kWeightsTag, "weights (bf16)"));
    } else {
      requests_.push_back(
          dist::start_send(comm, std::span<const float>(b.values), d, kWeightsTag, "weights"));
    }
  }
  return static_cast<std::int64_t>(destinations.size()) * static_cast<std::int64_t>(value_bytes);
}

bool VersionSends::done() {
  for (dist::Request& r : requests_)
    if (!r.test("asynchronous GRPO: a message")) return false;
  requests_.clear();
  return true;
}

void VersionSends::complete() {
  dist::Request::wait_all(requests_, "asynchronous GRPO: a policy version");
  requests_.clear();
}

}  // namespace l3::train::grpo
