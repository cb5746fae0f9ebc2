// NCCL for the emulated build: communicators of any size, the data moving over MPI between the
// ranks' processes (NCCL's own transport needs GPUs), so that the trainer's NCCL exchange runs
// with several ranks, each on an emulated device of its own ($L3_EMULATION_DEVICES, runtime.cpp).
//
// A collective is started when it is called and completed in its stream's order:
//   - the call runs its stream's queued work (with what that waits for), so the input holds
//     what the GPU would read when the stream reached the collective; it copies the input and
//     starts the matching non-blocking MPI collective;
//   - the stream gets a queued operation that waits for that MPI request and writes the output.
// Starting at the call is what keeps ranks from deadlocking: a rank's contribution leaves when
// its host reaches the call, as it would on a GPU, not when something on that rank happens to
// synchronise the stream (a rank could be waiting in a host MPI call for a peer whose stream
// waits for this rank's contribution). Outputs still appear only in stream order, so a missing
// join (the compute stream reading a bucket before the exchange wrote it) reads stale values.
//
// Sums: fp32, fp64 and integers with MPI_SUM; bf16 through a user operation that adds two values
// in fp32 and rounds to nearest even, which is what NCCL does at each step of its reduction (for
// two ranks: one rounding of a + b). Other operations and types are refused (ncclInvalidArgument),
// not approximated.
//
// Rendezvous: ncclGetUniqueId writes the creator's rank in MPI_COMM_WORLD into the id (NCCL writes
// the address of its bootstrap socket); ncclCommInitRank sends (NCCL rank, world rank) to the
// creator, which answers with the table, then the members build their communicator with
// MPI_Comm_create_group, collective over the members only. So MPI must be initialised and the
// id's creator must be a member, as in every use of the trainer. Communicators of one rank need no
// MPI: their collectives are copies, queued on the stream.
//
// Nonblocking communicators (ncclCommInitRankConfig with config.blocking = 0): the init returns
// ncclInProgress and the rendezvous advances only when ncclCommGetAsyncError is called, so a
// member that never arrives leaves the others polling, not stuck (they can abort). A collective
// called outside a group returns ncclInProgress at random and starts only at the next
// ncclCommGetAsyncError, as NCCL's may; ncclGroupEnd likewise reports ncclInProgress at random.
// Any other call on a communicator whose state is still ncclInProgress is refused
// (ncclInvalidUsage), so a caller that does not poll fails here.
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_emulation.hpp"

namespace {

// A rendezvous in progress (see the top). A member sends (NCCL rank, world rank) to the creator
// and waits for the table; the creator receives the members' messages one by one.
struct Rendezvous {
  bool creator = false;
  int tag = 0;
  std::vector<int> world_of;  // world rank by NCCL rank, -1 until known
  std::array<int, 2> member{};
  MPI_Request send = MPI_REQUEST_NULL;     // a member's message
  MPI_Request receive = MPI_REQUEST_NULL;  // a member: the table; the creator: the next member
  int arrived = 1;                         // the creator: members known, itself included
};

}  // namespace

struct ncclComm {
  int rank = 0;
  int ranks = 1;
  MPI_Comm mpi = MPI_COMM_NULL;  // ranks > 1
  bool nonblocking = false;
  // ncclInProgress while the rendezvous or a deferred call is pending (nonblocking only); an
  // error once the rendezvous failed.
  ncclResult_t state = ncclSuccess;
  std::unique_ptr<Rendezvous> joining;
  std::function<ncclResult_t()> deferred;  // a collective that starts at the next poll
};

namespace {

constexpr std::array<char, 16> kIdMagic = {'l', '3', 'e', 'm', 'u', '-',  'n',  'c',
                                           'c', 'l', '-', 'i', 'd', '\0', '\0', '\0'};
constexpr int kRendezvousTagBase = 20000;  // + serial % kRendezvousTags; MPI_TAG_UB >= 32767
constexpr int kRendezvousTags = 10000;

// What ncclUniqueId carries here.
struct EmulatedId {
  std::array<char, 16> magic = kIdMagic;
  int creator = -1;  // world rank of the process that made it; -1: MPI was not initialised
  int serial = 0;    // per creator, so that two rendezvous never share a tag
};
static_assert(sizeof(EmulatedId) <= sizeof(ncclUniqueId));

bool mpi_running() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

std::size_t nccl_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

// The MPI type that carries `type`'s bits (bf16 and fp16 as 16-bit integers).
MPI_Datatype carrier(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return MPI_INT8_T;
    case ncclUint8:
      return MPI_UINT8_T;
    case ncclFloat16:
    case ncclBfloat16:
      return MPI_UINT16_T;
    case ncclInt32:
      return MPI_INT32_T;
    case ncclUint32:
      return MPI_UINT32_T;
    case ncclFloat32:
      return MPI_FLOAT;
    case ncclInt64:
      return MPI_INT64_T;
    case ncclUint64:
      return MPI_UINT64_T;
    default:
      return MPI_DOUBLE;
  }
}

float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16U;
  float f = 0;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

std::uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept a NaN
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<std::uint16_t>((u >> 16U) | 0x40U);
  u += 0x7FFFU + ((u >> 16U) & 1U);
  return static_cast<std::uint16_t>(u >> 16U);
}

// MPI user operation: inout[i] = bf16(fp32(in[i]) + fp32(inout[i])). (MPI_User_function's
// signature: non-const pointers.)
void bf16_sum(void* in, void* inout, int* length,  // NOLINT(readability-non-const-parameter)
              MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

MPI_Op bf16_sum_op() {
  static const MPI_Op op = [] {
    MPI_Op created = MPI_OP_NULL;
    MPI_Op_create(&bf16_sum, 1, &created);
    return created;
  }();
  return op;
}

// The MPI reduction for (op, type), or MPI_OP_NULL where the emulation has none.
MPI_Op reduction(ncclRedOp_t op, ncclDataType_t type) {
  if (op != ncclSum) return MPI_OP_NULL;
  switch (type) {
    case ncclBfloat16:
      return bf16_sum_op();
    case ncclFloat32:
    case ncclFloat64:
    case ncclInt32:
    case ncclUint32:
    case ncclInt64:
    case ncclUint64:
      return MPI_SUM;
    default:
      return MPI_OP_NULL;
  }
}

// One started collective: the input as the call saw it, the output MPI fills, its request.
struct Transfer {
  std::vector<unsigned char> in;
  std::vector<unsigned char> out;
  MPI_Request request = MPI_REQUEST_NULL;
};

std::shared_ptr<Transfer> snapshot(cudaStream_t stream, const void* send, std::size_t bytes,
                                   std::size_t out_bytes) {
  cudaStreamSynchronize(stream);  // the input as the stream leaves it at this point
  auto t = std::make_shared<Transfer>();
  const auto* p = static_cast<const unsigned char*>(send);
  t->in.assign(p, p + bytes);
  t->out.resize(out_bytes);
  return t;
}

// Waits for a request without spinning a core: on a GPU, NCCL's collectives run on the device
// and leave the host's cores alone, and ranks sharing the cores (4 emulated devices on a 2-core
// machine) must not take the core from the peer being waited for. A few yields, then sleeps
// growing to 200 us.
void wait_quietly(MPI_Request* request) {
  std::chrono::microseconds pause{10};
  for (int polls = 0;; ++polls) {
    int done = 0;
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (done != 0) return;
    if (polls < 4) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds{200});
  }
}

// Queues the completion: wait for the request, then write `bytes` of the output at `recv`
// (nothing when recv is null).
void complete_in_order(cudaStream_t stream, std::shared_ptr<Transfer> t, void* recv,
                       std::size_t bytes) {
  l3emu::enqueue(stream, [t = std::move(t), recv, bytes] {
    wait_quietly(&t->request);
    if (recv != nullptr && bytes != 0) std::memcpy(recv, t->out.data(), bytes);
  });
}

// Snapshots `in_bytes` of `send`, starts the MPI collective `begin(transfer)` on it and queues
// the completion that writes `recv_bytes` at `recv` (none when recv is null).
template <typename Begin>
ncclResult_t start(cudaStream_t stream, const void* send, std::size_t in_bytes,
                   std::size_t out_bytes, void* recv, std::size_t recv_bytes, Begin begin) {
  std::shared_ptr<Transfer> t = snapshot(stream, send, in_bytes, out_bytes);
  if (begin(*t) != MPI_SUCCESS) return ncclSystemError;
  complete_in_order(stream, std::move(t), recv, recv_bytes);
  return ncclSuccess;
}

// One rank: every collective is a copy, queued on its stream.
ncclResult_t copy(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                  cudaStream_t stream) {
  const std::size_t bytes = count * nccl_size(type);
  if (send != recv && count != 0) {
    l3emu::enqueue(stream, [send, recv, bytes] { std::memmove(recv, send, bytes); });
  }
  return ncclSuccess;
}

bool valid(ncclComm_t comm, std::size_t count) {
  return comm != nullptr && count <= static_cast<std::size_t>(INT_MAX);
}

// What ncclGetLastError returns: the last refusal's reason (NCCL keeps one per process too).
std::string& last_error() {
  static std::string text;
  return text;
}

void refuse(const char* why) {
  std::fprintf(stderr, "emulated NCCL: %s\n", why);
  last_error() = std::string("emulated NCCL: ") + why;
}

// Starts the rendezvous for NCCL rank `rank` (see the top).
std::unique_ptr<Rendezvous> start_rendezvous(const EmulatedId& id, int ranks, int rank) {
  auto r = std::make_unique<Rendezvous>();
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  r->tag = kRendezvousTagBase + id.serial % kRendezvousTags;
  r->world_of.assign(static_cast<std::size_t>(ranks), -1);
  r->world_of[static_cast<std::size_t>(rank)] = me;
  r->creator = me == id.creator;
  if (!r->creator) {
    r->member = {rank, me};
    MPI_Isend(r->member.data(), 2, MPI_INT, id.creator, r->tag, MPI_COMM_WORLD, &r->send);
    MPI_Irecv(r->world_of.data(), ranks, MPI_INT, id.creator, r->tag, MPI_COMM_WORLD, &r->receive);
  }
  return r;
}

// Cancels what a rendezvous left pending (an abort before every member arrived).
void cancel(Rendezvous& r) {
  if (r.receive != MPI_REQUEST_NULL) {
    MPI_Cancel(&r.receive);
    MPI_Wait(&r.receive, MPI_STATUS_IGNORE);
  }
  if (r.send != MPI_REQUEST_NULL) MPI_Request_free(&r.send);
}

// One step of the rendezvous: ncclInProgress until every member has arrived and the
// communicator's MPI side exists.
ncclResult_t advance(ncclComm& comm) {
  Rendezvous& r = *comm.joining;
  int done = 0;
  if (r.creator) {
    while (r.arrived < comm.ranks) {
      if (r.receive == MPI_REQUEST_NULL) {
        MPI_Irecv(r.member.data(), 2, MPI_INT, MPI_ANY_SOURCE, r.tag, MPI_COMM_WORLD, &r.receive);
      }
      MPI_Test(&r.receive, &done, MPI_STATUS_IGNORE);
      if (done == 0) return ncclInProgress;
      if (r.member[0] < 0 || r.member[0] >= comm.ranks ||
          r.world_of[static_cast<std::size_t>(r.member[0])] >= 0) {
        refuse("ncclCommInitRank: two members claim one rank, or a rank is out of range");
        return ncclInvalidUsage;
      }
      r.world_of[static_cast<std::size_t>(r.member[0])] = r.member[1];
      ++r.arrived;
    }
    for (int m = 0; m < comm.ranks; ++m) {
      if (m == comm.rank) continue;
      MPI_Send(r.world_of.data(), comm.ranks, MPI_INT, r.world_of[static_cast<std::size_t>(m)],
               r.tag, MPI_COMM_WORLD);
    }
  } else {
    MPI_Test(&r.receive, &done, MPI_STATUS_IGNORE);
    if (done == 0) return ncclInProgress;
    MPI_Wait(&r.send, MPI_STATUS_IGNORE);
  }
  // Every member has the table now, so each reaches this collective over the members.
  MPI_Group world_group = MPI_GROUP_NULL;
  MPI_Group members = MPI_GROUP_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, comm.ranks, r.world_of.data(), &members);
  const int status = MPI_Comm_create_group(MPI_COMM_WORLD, members, r.tag, &comm.mpi);
  MPI_Group_free(&members);
  MPI_Group_free(&world_group);
  comm.joining.reset();
  return status == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

// The collectives' common entry: `work` starts the collective now, or, on a nonblocking
// communicator outside a group and at random, at the next ncclCommGetAsyncError.
thread_local int g_group_depth = 0;
thread_local std::vector<ncclComm_t> g_group_members;

ncclResult_t issue(ncclComm_t comm, std::function<ncclResult_t()> work) {
  if (comm->state == ncclInProgress) {
    refuse(
        "a call on a nonblocking communicator whose last call is still in progress (poll "
        "ncclCommGetAsyncError until it is not)");
    return ncclInvalidUsage;
  }
  if (comm->state != ncclSuccess) return comm->state;
  if (g_group_depth > 0) {
    g_group_members.push_back(comm);
    return work();
  }
  if (comm->nonblocking && l3emu::random_choice()) {
    comm->deferred = std::move(work);
    comm->state = ncclInProgress;
    return ncclInProgress;
  }
  return work();
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument (the llama3-hpc emulation refuses this operation or type)";
    case ncclInvalidUsage:
      return "invalid usage (llama3-hpc emulation: more than one rank needs MPI, and the id's "
             "creator as a member)";
    case ncclInProgress:
      return "operation in progress";
    case ncclSystemError:
      return "system error (an MPI call of the llama3-hpc emulation failed)";
    default:
      return "error (llama3-hpc emulation)";
  }
}
const char* ncclGetLastError(ncclComm_t /*comm*/) { return last_error().c_str(); }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static int serial = 0;
  EmulatedId made;
  if (mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &made.creator);
  made.serial = serial++;
  *id = ncclUniqueId{};
  std::memcpy(id->internal, &made, sizeof made);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int ranks, ncclUniqueId unique_id, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr || ranks < 1 || rank < 0 || rank >= ranks) {
    refuse(
        ("ncclCommInitRank: invalid rank " + std::to_string(rank) + " of " + std::to_string(ranks))
            .c_str());
    return ncclInvalidArgument;
  }
  if (config != nullptr && config->magic != 0xcafebeef) {
    refuse("ncclCommInitRankConfig: a config not made with NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  const bool nonblocking =
      config != nullptr && config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking == 0;
  EmulatedId id;
  std::memcpy(&id, unique_id.internal, sizeof id);
  if (ranks > 1 && (id.magic != kIdMagic || id.creator < 0 || !mpi_running())) {
    refuse("ncclCommInitRank: more than one rank needs MPI, and an id from ncclGetUniqueId");
    return ncclInvalidUsage;
  }
  auto made = std::make_unique<ncclComm>();
  made->rank = rank;
  made->ranks = ranks;
  made->nonblocking = nonblocking;
  if (ranks > 1) made->joining = start_rendezvous(id, ranks, rank);
  if (nonblocking) {  // NCCL's init goes on in a thread of its own: always in progress here
    made->state = ncclInProgress;
    *comm = made.release();
    return ncclInProgress;
  }
  while (made->joining) {
    if (const ncclResult_t r = advance(*made); r != ncclSuccess && r != ncclInProgress) {
      cancel(*made->joining);
      return r;
    }
  }
  *comm = made.release();
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int ranks, ncclUniqueId unique_id, int rank) {
  return ncclCommInitRankConfig(comm, ranks, unique_id, rank, nullptr);
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->state != ncclSuccess)
    return comm->state == ncclInProgress ? ncclInvalidUsage : comm->state;
  if (comm->nonblocking && l3emu::random_choice()) {
    comm->state = ncclInProgress;
    return ncclInProgress;
  }
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->joining) cancel(*comm->joining);
  if (comm->mpi != MPI_COMM_NULL && mpi_running()) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  // A rendezvous still waiting for members is cancelled. The MPI communicator is left alone:
  // collectives queued on it may still wait for peers that never join, and freeing it under them
  // is not allowed.
  if (comm->joining) cancel(*comm->joining);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (comm == nullptr || error == nullptr) return ncclInvalidArgument;
  if (comm->joining) {
    comm->state = advance(*comm);
    if (comm->state != ncclSuccess && comm->state != ncclInProgress) cancel(*comm->joining);
  } else if (comm->deferred) {
    const std::function<ncclResult_t()> work = std::move(comm->deferred);
    comm->deferred = nullptr;
    comm->state = work();
  } else if (comm->state == ncclInProgress) {
    comm->state = ncclSuccess;
  }
  *error = comm->state;
  return ncclSuccess;
}
// Collectives start at the call (see the top), so a group needs nothing more: the members of a
// group are started in the order they were called, the same order on every rank. A group of
// nonblocking communicators may end in progress.
ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return ncclInvalidUsage;
  if (--g_group_depth > 0) return ncclSuccess;
  std::vector<ncclComm_t> members = std::move(g_group_members);
  g_group_members.clear();
  bool in_progress = false;
  for (ncclComm_t c : members) {
    if (c->nonblocking && c->state == ncclSuccess && l3emu::random_choice()) {
      c->state = ncclInProgress;
      in_progress = true;
    }
  }
  return in_progress ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm, count * static_cast<std::size_t>(comm == nullptr ? 1 : comm->ranks))) {
    return ncclInvalidArgument;
  }
  return issue(comm, [=]() -> ncclResult_t {
    if (comm->ranks == 1) return copy(send, recv, count, type, stream);
    const std::size_t piece = count * nccl_size(type);  // one rank's share
    const std::size_t bucket = piece * static_cast<std::size_t>(comm->ranks);
    const int n = static_cast<int>(count);
    return start(stream, send, piece, bucket, recv, bucket, [&](Transfer& t) {
      return MPI_Iallgather(t.in.data(), n, carrier(type), t.out.data(), n, carrier(type),
                            comm->mpi, &t.request);
    });
  });
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm, count) || reduction(op, type) == MPI_OP_NULL) return ncclInvalidArgument;
  return issue(comm, [=]() -> ncclResult_t {
    if (comm->ranks == 1) return copy(send, recv, count, type, stream);
    const std::size_t piece = count * nccl_size(type);  // one rank's share
    const std::size_t bucket = piece * static_cast<std::size_t>(comm->ranks);
    return start(stream, send, bucket, piece, recv, piece, [&](Transfer& t) {
      return MPI_Ireduce_scatter_block(t.in.data(), t.out.data(), static_cast<int>(count),
                                       carrier(type), reduction(op, type), comm->mpi, &t.request);
    });
  });
}
ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm, count) || reduction(op, type) == MPI_OP_NULL) return ncclInvalidArgument;
  return issue(comm, [=]() -> ncclResult_t {
    if (comm->ranks == 1) return copy(send, recv, count, type, stream);
    const std::size_t bytes = count * nccl_size(type);
    return start(stream, send, bytes, bytes, recv, bytes, [&](Transfer& t) {
      return MPI_Iallreduce(t.in.data(), t.out.data(), static_cast<int>(count), carrier(type),
                            reduction(op, type), comm->mpi, &t.request);
    });
  });
}
ncclResult_t ncclReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm, count) || reduction(op, type) == MPI_OP_NULL || root < 0 ||
      root >= comm->ranks) {
    return ncclInvalidArgument;
  }
  return issue(comm, [=]() -> ncclResult_t {
    if (comm->ranks == 1) return copy(send, recv, count, type, stream);
    const std::size_t bytes = count * nccl_size(type);
    const bool at_root = comm->rank == root;
    // Only the root's output is written (NCCL ignores recv on the other ranks).
    return start(stream, send, bytes, at_root ? bytes : 0, at_root ? recv : nullptr, bytes,
                 [&](Transfer& t) {
                   return MPI_Ireduce(t.in.data(), at_root ? t.out.data() : nullptr,
                                      static_cast<int>(count), carrier(type), reduction(op, type),
                                      root, comm->mpi, &t.request);
                 });
  });
}
ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm, count) || root < 0 || root >= comm->ranks) return ncclInvalidArgument;
  return issue(comm, [=]() -> ncclResult_t {
    if (comm->ranks == 1) return copy(send, recv, count, type, stream);
    const std::size_t bytes = count * nccl_size(type);
    const bool at_root = comm->rank == root;
    // The root sends its input; the others receive into `out`. MPI_Ibcast works in place, so the
    // root's buffer is its snapshot.
    auto t = snapshot(stream, at_root ? send : recv, at_root ? bytes : 0, at_root ? 0 : bytes);
    void* buffer = at_root ? t->in.data() : t->out.data();
    const int status =
        MPI_Ibcast(buffer, static_cast<int>(count), carrier(type), root, comm->mpi, &t->request);
    if (status != MPI_SUCCESS) return ncclSystemError;
    if (at_root) {
      // The root's recv gets its own input, unless it is the same buffer.
      l3emu::enqueue(stream, [t] { wait_quietly(&t->request); });
      return send == recv ? ncclSuccess : copy(send, recv, count, type, stream);
    }
    complete_in_order(stream, t, recv, bytes);
    return ncclSuccess;
  });
}

}  // extern "C"
