// The emulated NCCL (nccl.cpp) across MPI ranks (mpiexec -n 2 and -n 3): the collectives the
// trainer's NCCL exchange uses, in place, in bf16 and fp32, even and uneven pieces; what travels
// is the input as the stream left it at the call; refusals; nonblocking communicators (init
// and calls in progress until polled, an init abandoned by a missing member); and several devices
// ($L3_EMULATION_DEVICES) with PCI bus ids of their own.
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch.hpp"
#include "cuda_emulation.hpp"

namespace {

void check(cudaError_t status) {
  if (status != cudaSuccess) throw std::runtime_error(cudaGetErrorString(status));
}
void check(ncclResult_t status) {
  if (status != ncclSuccess) throw std::runtime_error(ncclGetErrorString(status));
}

struct World {
  int rank = 0;
  int size = 1;
  World() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
};

// A communicator over MPI_COMM_WORLD, its id made on world rank 0 and broadcast, as the trainer
// does over its own communicator; and a stream.
class Nccl {
 public:
  Nccl() {
    ncclUniqueId id{};
    if (world_.rank == 0) check(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    check(ncclCommInitRank(&comm_, world_.size, id, world_.rank));
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~Nccl() {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;
  Nccl(Nccl&&) = delete;
  Nccl& operator=(Nccl&&) = delete;

  [[nodiscard]] ncclComm_t comm() const { return comm_; }
  [[nodiscard]] cudaStream_t stream() const { return stream_; }
  [[nodiscard]] const World& world() const { return world_; }
  void finish() const { check(cudaStreamSynchronize(stream_)); }

 private:
  World world_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// Device memory holding `values`, copied in on the legacy stream (complete on return).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& values) : size_(values.size()) {
    void* p = nullptr;
    check(cudaMalloc(&p, size_ * sizeof(T)));
    data_ = static_cast<T*>(p);
    check(cudaMemcpy(data_, values.data(), size_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&&) = delete;
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;

  [[nodiscard]] T* data() const { return data_; }
  [[nodiscard]] std::vector<T> read() const {
    std::vector<T> out(size_);
    check(cudaMemcpy(out.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  std::size_t size_;
  T* data_ = nullptr;
};

std::uint16_t bf16(float f) {  // exact for the small integers and halves used here
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<std::uint16_t>(u >> 16U);
}

}  // namespace

TEST_CASE("emulated NCCL reduce-scatter sums each rank's piece in place", "[nccl]") {
  const Nccl nccl;
  const int rank = nccl.world().rank;
  const int size = nccl.world().size;
  const int count = 37;  // odd: no vector width divides it
  // Rank r holds r + 1 + i / 2 at element i; the sum over ranks is size*(size+1)/2 + size*i/2.
  std::vector<float> values(static_cast<std::size_t>(count * size));
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(rank + 1) + static_cast<float>(i) / 2;
  }
  std::vector<std::uint16_t> halves(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) halves[i] = bf16(values[i] / 64);
  const DeviceBuffer<float> f32(values);
  const DeviceBuffer<std::uint16_t> b16(halves);
  check(ncclReduceScatter(f32.data(), f32.data() + static_cast<std::ptrdiff_t>(rank) * count, count,
                          ncclFloat32, ncclSum, nccl.comm(), nccl.stream()));
  check(ncclReduceScatter(b16.data(), b16.data() + static_cast<std::ptrdiff_t>(rank) * count, count,
                          ncclBfloat16, ncclSum, nccl.comm(), nccl.stream()));
  nccl.finish();
  const std::vector<float> got = f32.read();
  const std::vector<std::uint16_t> got16 = b16.read();
  for (int i = 0; i < count * size; ++i) {
    const auto at = static_cast<std::size_t>(i);
    const bool mine = i / count == rank;
    const float sum = static_cast<float>(size * (size + 1)) / 2 + static_cast<float>(size * i) / 2;
    CHECK(got[at] == (mine ? sum : values[at]));
    // The bf16 sums of (r + 1 + i/2) / 64 are exact in bf16 while sum * 2 < 256.
    if (sum * 2 < 256) CHECK(got16[at] == (mine ? bf16(sum / 64) : halves[at]));
  }
}

TEST_CASE("emulated NCCL rounds a bf16 sum to nearest even like the GPU", "[nccl]") {
  const Nccl nccl;
  // Rank 0 holds 1, rank 1 holds 2^-8 and 3 * 2^-8, other ranks 0 (sums with 0 are exact, so
  // the one inexact addition is the same whatever order the ranks meet in).
  // 1 + 2^-8 lies halfway between the bf16 neighbours 1 and 1 + 2^-7: the even one is 1.
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: the even one is 1 + 2^-6.
  const int rank = nccl.world().rank;
  const float low = rank == 0 ? 1.0F : rank == 1 ? 0.00390625F : 0.0F;
  const float high = rank == 0 ? 1.0F : rank == 1 ? 3 * 0.00390625F : 0.0F;
  const DeviceBuffer<std::uint16_t> b16({bf16(low), bf16(high)});
  check(
      ncclAllReduce(b16.data(), b16.data(), 2, ncclBfloat16, ncclSum, nccl.comm(), nccl.stream()));
  nccl.finish();
  const float rounded_high = nccl.world().size == 1 ? 1.0F : 1.015625F;
  CHECK((b16.read() == std::vector<std::uint16_t>{bf16(1.0F), bf16(rounded_high)}));
}

TEST_CASE("emulated NCCL all-gather fills the bucket in place", "[nccl]") {
  const Nccl nccl;
  const int rank = nccl.world().rank;
  const int size = nccl.world().size;
  const int count = 9;
  std::vector<float> values(static_cast<std::size_t>(count * size), -1.0F);
  for (int i = 0; i < count; ++i) {
    values[static_cast<std::size_t>(rank) * count + static_cast<std::size_t>(i)] =
        100.0F * static_cast<float>(rank) + static_cast<float>(i);
  }
  const DeviceBuffer<float> buffer(values);
  check(ncclAllGather(buffer.data() + static_cast<std::ptrdiff_t>(rank) * count, buffer.data(),
                      count, ncclFloat32, nccl.comm(), nccl.stream()));
  nccl.finish();
  const std::vector<float> got = buffer.read();
  for (int i = 0; i < count * size; ++i) {
    const int owner = i / count;  // whole ranks: an integer division
    CHECK(got[static_cast<std::size_t>(i)] ==
          100.0F * static_cast<float>(owner) + static_cast<float>(i % count));
  }
}

TEST_CASE("emulated NCCL grouped reduces and broadcasts serve uneven pieces", "[nccl]") {
  const Nccl nccl;
  const int rank = nccl.world().rank;
  const int size = nccl.world().size;
  // Piece r is [begin(r), begin(r + 1)) with sizes 5, 3, 8, ... (uneven), as the trainer's first
  // bucket may be.
  std::vector<int> begin{0};
  for (int r = 0; r < size; ++r) begin.push_back(begin.back() + 3 + (5 * (r + 1)) % 7);
  const auto total = static_cast<std::size_t>(begin.back());
  std::vector<float> values(total);
  for (std::size_t i = 0; i < total; ++i)
    values[i] = static_cast<float>(rank * 1000) + static_cast<float>(i);
  const DeviceBuffer<float> buffer(values);
  auto piece = [&](int r) { return buffer.data() + begin[static_cast<std::size_t>(r)]; };
  auto length = [&](int r) {
    return static_cast<std::size_t>(begin[static_cast<std::size_t>(r) + 1] -
                                    begin[static_cast<std::size_t>(r)]);
  };
  check(ncclGroupStart());
  for (int r = 0; r < size; ++r) {
    check(ncclReduce(piece(r), piece(r), length(r), ncclFloat32, ncclSum, r, nccl.comm(),
                     nccl.stream()));
  }
  check(ncclGroupEnd());
  nccl.finish();
  // Own piece summed; the rest untouched.
  const std::vector<float> reduced = buffer.read();
  const float rank_sum = 1000.0F * static_cast<float>(size * (size - 1)) / 2;
  for (std::size_t i = 0; i < total; ++i) {
    const bool mine = static_cast<int>(i) >= begin[static_cast<std::size_t>(rank)] &&
                      static_cast<int>(i) < begin[static_cast<std::size_t>(rank) + 1];
    CHECK(reduced[i] ==
          (mine ? rank_sum + static_cast<float>(size) * static_cast<float>(i) : values[i]));
  }
  check(ncclGroupStart());
  for (int r = 0; r < size; ++r) {
    check(ncclBroadcast(piece(r), piece(r), length(r), ncclFloat32, r, nccl.comm(), nccl.stream()));
  }
  check(ncclGroupEnd());
  nccl.finish();
  const std::vector<float> gathered = buffer.read();
  for (std::size_t i = 0; i < total; ++i) {
    CHECK(gathered[i] == rank_sum + static_cast<float>(size) * static_cast<float>(i));
  }
}

TEST_CASE("emulated NCCL sends the input as its stream left it at the call", "[nccl]") {
  const Nccl nccl;
  const int size = nccl.world().size;
  const DeviceBuffer<float> buffer(std::vector<float>(4, 5.0F));
  // Streams run their work at the latest moment here (not also at random earlier ones), so that
  // the writes before the call are still queued when it is made.
  const bool random_progress = GENERATE(false, true);
  const bool was = l3emu::set_random_progress(random_progress);
  // Queued on the collective's stream before the call: it travels. Queued after: it does not.
  const float two = 2.0F;
  check(cudaMemsetAsync(buffer.data(), 0, 4 * sizeof(float), nccl.stream()));
  check(
      cudaMemcpyAsync(buffer.data() + 1, &two, sizeof two, cudaMemcpyHostToDevice, nccl.stream()));
  check(ncclAllReduce(buffer.data(), buffer.data() + 2, 2, ncclFloat32, ncclSum, nccl.comm(),
                      nccl.stream()));
  check(cudaMemsetAsync(buffer.data(), 0x40, 2 * sizeof(float), nccl.stream()));
  nccl.finish();
  float pattern = 0;
  const std::uint32_t filled = 0x40404040U;
  std::memcpy(&pattern, &filled, sizeof pattern);
  CHECK((buffer.read() ==
         std::vector<float>{pattern, pattern, 0.0F, 2.0F * static_cast<float>(size)}));
  l3emu::set_random_progress(was);
}

TEST_CASE("emulated NCCL writes its output in stream order, seen only after a wait", "[nccl]") {
  const Nccl nccl;
  const int size = nccl.world().size;
  const bool was = l3emu::set_random_progress(false);  // the latest moment CUDA allows
  const DeviceBuffer<float> buffer(std::vector<float>(2, 1.0F));
  const DeviceBuffer<float> early(std::vector<float>(2, -1.0F));
  const DeviceBuffer<float> late(std::vector<float>(2, -1.0F));
  cudaStream_t other = nullptr;
  cudaEvent_t reduced = nullptr;
  check(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  check(cudaEventCreateWithFlags(&reduced, cudaEventDisableTiming));
  check(ncclAllReduce(buffer.data(), buffer.data(), 2, ncclFloat32, ncclSum, nccl.comm(),
                      nccl.stream()));
  // Another stream that does not wait for the collective reads what was there before it (a
  // missing join); after an event wait, the sum.
  check(cudaMemcpyAsync(early.data(), buffer.data(), 2 * sizeof(float), cudaMemcpyDeviceToDevice,
                        other));
  check(cudaStreamSynchronize(other));
  check(cudaEventRecord(reduced, nccl.stream()));
  check(cudaStreamWaitEvent(other, reduced, 0));
  check(cudaMemcpyAsync(late.data(), buffer.data(), 2 * sizeof(float), cudaMemcpyDeviceToDevice,
                        other));
  check(cudaStreamSynchronize(other));
  CHECK((early.read() == std::vector<float>(2, 1.0F)));
  CHECK((late.read() == std::vector<float>(2, static_cast<float>(size))));
  cudaEventDestroy(reduced);
  cudaStreamDestroy(other);
  l3emu::set_random_progress(was);
}

TEST_CASE("emulated NCCL refuses what it does not model", "[nccl]") {
  const Nccl nccl;
  const DeviceBuffer<float> buffer(std::vector<float>(8, 1.0F));
  const int size = nccl.world().size;
  CHECK(ncclAllReduce(buffer.data(), buffer.data(), 8, ncclFloat32, ncclProd, nccl.comm(),
                      nccl.stream()) == ncclInvalidArgument);
  CHECK(ncclAllReduce(buffer.data(), buffer.data(), 4, ncclFloat16, ncclSum, nccl.comm(),
                      nccl.stream()) == ncclInvalidArgument);
  CHECK(ncclReduce(buffer.data(), buffer.data(), 8, ncclFloat32, ncclSum, size, nccl.comm(),
                   nccl.stream()) == ncclInvalidArgument);
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRank(&comm, 2, ncclUniqueId{}, 0) == ncclInvalidUsage);  // not from GetUniqueId
  nccl.finish();
  CHECK((buffer.read() == std::vector<float>(8, 1.0F)));
}

namespace {

ncclUniqueId shared_id(const World& world) {
  ncclUniqueId id{};
  if (world.rank == 0) check(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  return id;
}

// Polls a nonblocking communicator until its state is no longer ncclInProgress.
ncclResult_t poll(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) check(ncclCommGetAsyncError(comm, &state));
  return state;
}

}  // namespace

TEST_CASE("emulated NCCL nonblocking communicators finish their calls when polled", "[nccl]") {
  const World world;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRankConfig(&comm, world.size, shared_id(world), world.rank, &config) ==
        ncclInProgress);
  const DeviceBuffer<float> buffer(std::vector<float>(4, 1.0F));
  // Nothing but a poll, an abort or a destroy while the init is in progress.
  CHECK(ncclAllReduce(buffer.data(), buffer.data(), 4, ncclFloat32, ncclSum, comm, nullptr) ==
        ncclInvalidUsage);
  REQUIRE(poll(comm) == ncclSuccess);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Twenty all-reduces: some return ncclInProgress (random), and start only at the poll; a call
  // before that poll is refused. Every rank makes the same calls, so they pair up.
  int deferred = 0;
  for (int i = 0; i < 20; ++i) {
    const ncclResult_t r =
        ncclAllReduce(buffer.data(), buffer.data(), 4, ncclFloat32, ncclSum, comm, stream);
    if (r == ncclInProgress) {
      ++deferred;
      CHECK(ncclBroadcast(buffer.data(), buffer.data(), 4, ncclFloat32, 0, comm, stream) ==
            ncclInvalidUsage);
    }
    REQUIRE(poll(comm) == ncclSuccess);
  }
  check(cudaStreamSynchronize(stream));
  // Each all-reduce multiplied every element by the number of ranks.
  float expected = 1.0F;
  for (int i = 0; i < 20; ++i) expected *= static_cast<float>(world.size);
  CHECK((buffer.read() == std::vector<float>(4, expected)));
  INFO("deferred " << deferred << " of 20");
  CHECK(deferred > 0);  // a fair coin: all 20 the same way happens once in a million runs
  CHECK(deferred < 20);
  // A grouped call may end in progress too; finalize, then destroy.
  check(ncclGroupStart());
  check(ncclBroadcast(buffer.data(), buffer.data(), 4, ncclFloat32, 0, comm, stream));
  const ncclResult_t ended = ncclGroupEnd();
  CHECK((ended == ncclSuccess || ended == ncclInProgress));
  REQUIRE(poll(comm) == ncclSuccess);
  const ncclResult_t finalized = ncclCommFinalize(comm);
  CHECK((finalized == ncclSuccess || finalized == ncclInProgress));
  REQUIRE(poll(comm) == ncclSuccess);
  check(cudaStreamSynchronize(stream));
  check(ncclCommDestroy(comm));
  cudaStreamDestroy(stream);
}

TEST_CASE("emulated NCCL nonblocking init waits for a missing member until aborted", "[nccl]") {
  const World world;
  if (world.size < 2) {
    SUCCEED("one rank: no member to miss");
    return;
  }
  const ncclUniqueId id = shared_id(world);
  const bool absent = world.rank == world.size - 1;  // the last rank never joins
  if (!absent) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    CHECK(ncclCommInitRankConfig(&comm, world.size, id, world.rank, &config) == ncclInProgress);
    for (int i = 0; i < 200; ++i) {
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm, &state));
      REQUIRE(state == ncclInProgress);
    }
    check(ncclCommAbort(comm));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The abandoned rendezvous leaves nothing that a new one could match: a full init works.
  const Nccl nccl;
  const DeviceBuffer<float> buffer(std::vector<float>(2, 1.0F));
  check(ncclAllReduce(buffer.data(), buffer.data(), 2, ncclFloat32, ncclSum, nccl.comm(),
                      nccl.stream()));
  nccl.finish();
  CHECK((buffer.read() == std::vector<float>(2, static_cast<float>(world.size))));
}

TEST_CASE("emulated devices have PCI bus ids of their own", "[nccl]") {
  int devices = 0;
  check(cudaGetDeviceCount(&devices));
  const char* wanted = std::getenv("L3_EMULATION_DEVICES");
  CHECK(devices == (wanted != nullptr ? std::stoi(wanted) : 1));
  std::set<std::string> ids;
  for (int d = 0; d < devices; ++d) {
    char id[32] = {};
    check(cudaDeviceGetPCIBusId(id, sizeof id, d));
    ids.emplace(id);
    check(cudaSetDevice(d));
  }
  CHECK(static_cast<int>(ids.size()) == devices);
  CHECK(cudaSetDevice(devices) == cudaErrorInvalidDevice);
  cudaGetLastError();
  check(cudaSetDevice(0));
}
