// The CUDA runtime calls of the backend, on the host, for the emulated build (L3_CUDA=EMULATED):
// devices ("llama3-hpc CUDA emulation": one, or $L3_EMULATION_DEVICES of them, each with a PCI
// bus id of its own, so that ranks of a node can each take one and use NCCL), device memory from
// the host heap (tracked, so that cudaPointerGetAttributes can tell device from host, and
// NaN-filled), streams and events, and the current device (per host thread, as in CUDA). The
// devices share this process's memory: an emulated device is a name and a number, not a separate
// address space.
//
// Streams are deferred: kernels, GEMMs, collectives, memsets and copies between device and
// pinned memory are queued on their stream and run when something needs them (a synchronisation
// of the stream, an event or the device, a copy to or from pageable memory, which CUDA performs
// in order with its stream, a cudaFree, a cudaStreamWaitEvent whose waiting stream runs) or, at
// random moments before that, when the emulation decides to make progress: after each enqueue,
// with even odds, the oldest operation of a random stream runs (with what it waits for). So
// streams run ahead of and behind each other in ways a GPU may: a missing event wait between
// streams reads stale data or overwrites data not yet read, and a host buffer reused before the
// copy that reads it ran shows its new contents. The choices come from a fixed seed
// ($L3_EMULATION_SEED changes it), so a failure repeats. $L3_EMULATION_PROGRESS=latest turns the
// random progress off. Legacy default-stream ordering is modelled for streams created without
// cudaStreamNonBlocking.
//
// Graphs: between cudaStreamBeginCapture and cudaStreamEndCapture, work enqueued on the
// capturing stream is recorded, not run (kernels, GEMMs, memsets, copies between device and
// pinned memory, each with the arguments it was given: a copy reads its source, a kernel its
// buffers, when the graph runs, as on a GPU). cudaGraphLaunch queues the recorded work on a
// stream again, in its order. What CUDA refuses while a stream captures (thread-local or global
// mode) fails here with its error and invalidates the capture, so that capture-unsafe code
// fails in the emulated tests: cudaMalloc/cudaFree/cudaMallocHost/cudaFreeHost and a device
// synchronisation (cudaErrorStreamCaptureUnsupported), a synchronisation or query of the
// capturing stream, a copy between it and pageable memory, and events recorded on or waited for
// by it (CUDA allows the last two for fork/join between streams; the emulation does not model
// multi-stream captures, and the backend captures on one stream).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emulation.hpp"

namespace {

constexpr std::size_t kAlignment = 256;  // what cudaMalloc guarantees

struct Allocation {
  std::size_t bytes;
  cudaMemoryType type;
  int device;  // current when it was allocated
};

constexpr int kMaxDevices = 16;

// $L3_EMULATION_DEVICES: how many devices this process sees (1 unless set; 1 to 16).
int device_count_from_environment() {
  const char* text = std::getenv("L3_EMULATION_DEVICES");
  if (text == nullptr || *text == '\0') return 1;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (*end != '\0' || n < 1 || n > kMaxDevices) {
    std::fprintf(stderr, "L3_EMULATION_DEVICES=%s: expected a number of devices from 1 to %d\n",
                 text, kMaxDevices);
    std::abort();
  }
  return static_cast<int>(n);
}

struct Runtime {
  std::mutex mutex;
  std::map<const char*, Allocation> allocations;  // base address -> extent
  cudaError_t last_error = cudaSuccess;
  int device_count = device_count_from_environment();
};

Runtime& runtime() {
  static Runtime r;
  return r;
}

// The current device, as in CUDA one per host thread (each starts on device 0).
thread_local int current_device = 0;

cudaError_t fail(cudaError_t error) {
  runtime().last_error = error;
  return error;
}

bool valid_device(int device) { return device >= 0 && device < runtime().device_count; }

cudaError_t allocate(void** pointer, std::size_t bytes, cudaMemoryType type) {
  if (pointer == nullptr) return fail(cudaErrorInvalidValue);
  const std::size_t rounded =
      (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0xFF,
              rounded);  // NaN in bf16 and fp32: an unwritten element is not silently right
  Runtime& r = runtime();
  const std::lock_guard lock(r.mutex);
  r.allocations[static_cast<const char*>(p)] = {bytes, type, current_device};
  *pointer = p;
  return cudaSuccess;
}

cudaError_t release(void* p, cudaMemoryType type) {
  if (p == nullptr) return cudaSuccess;
  Runtime& r = runtime();
  {
    const std::lock_guard lock(r.mutex);
    const auto it = r.allocations.find(static_cast<const char*>(p));
    if (it == r.allocations.end() || it->second.type != type) return fail(cudaErrorInvalidValue);
    r.allocations.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

// A stream's queue: operations enqueued and not yet run, and how many ran.
struct Graph;

struct Stream {
  int priority = 0;
  bool blocking = true;      // synchronises with the legacy default stream
  Graph* capture = nullptr;  // recording into this graph (cudaStreamBeginCapture)
  std::deque<std::function<void()>> pending;
  std::uint64_t enqueued = 0;
  std::uint64_t executed = 0;
};

// Where an event was recorded: its stream and the number of operations queued there before it.
struct Event {
  std::chrono::steady_clock::time_point time;
  bool recorded = false;  // its record ran
  bool timing = true;
  Stream* stream = nullptr;
  std::uint64_t position = 0;
};

Stream& legacy_stream() {
  static Stream s;
  return s;
}

// A captured graph (cudaGraph_t) and an instantiated one (cudaGraphExec_t): the recorded work,
// shared so that a launch still queued outlives cudaGraphExecDestroy.
struct Graph {
  std::shared_ptr<std::vector<std::function<void()>>> work =
      std::make_shared<std::vector<std::function<void()>>>();
  bool invalidated = false;  // an illegal call during its capture
  bool relaxed = false;      // cudaStreamCaptureModeRelaxed: allocations allowed
};
struct GraphExec {
  std::shared_ptr<const std::vector<std::function<void()>>> work;
};

// The streams capturing now (one at a time in practice; several are allowed).
std::set<Stream*>& capturing() {
  static std::set<Stream*> s;
  return s;
}

// An illegal call during a capture: the captures end invalidated (cudaStreamEndCapture then
// returns cudaErrorStreamCaptureInvalidated), and the call fails with `error`.
cudaError_t capture_violation(cudaError_t error, Stream* stream = nullptr);

struct Streams {
  std::set<Stream*> all;                         // live streams, for device-wide synchronisation
  std::vector<std::unique_ptr<Stream>> retired;  // destroyed, all their work done
};
Streams& streams() {
  static Streams s;
  return s;
}

Stream* stream_of(cudaStream_t handle) {
  return handle == nullptr ? &legacy_stream() : reinterpret_cast<Stream*>(handle);
}

// Runs stream s's queue up to (not beyond) `position` operations. An operation may drain other
// streams first (an event wait); the emulated grid runs one launch at a time.
void drain(Stream& s, std::uint64_t position) {
  while (s.executed < position && !s.pending.empty()) {
    std::function<void()> op = std::move(s.pending.front());
    s.pending.pop_front();
    ++s.executed;
    op();
  }
}
void drain_all(Stream& s) { drain(s, s.enqueued); }
void drain_device() {
  drain_all(legacy_stream());
  for (Stream* s : streams().all) drain_all(*s);
}

void push(Stream& s, std::function<void()> op) {
  s.pending.push_back(std::move(op));
  ++s.enqueued;
}

// The random progress described at the top (xorshift64*, seeded from $L3_EMULATION_SEED).
std::uint64_t next_random() {
  static std::uint64_t state = [] {
    const char* text = std::getenv("L3_EMULATION_SEED");
    const std::uint64_t seed = text != nullptr ? std::strtoull(text, nullptr, 10) : 20261130U;
    return seed * 0x9E3779B97F4A7C15ULL + 1;
  }();
  state ^= state >> 12U;
  state ^= state << 25U;
  state ^= state >> 27U;
  return state * 0x2545F4914F6CDD1DULL;
}

// $L3_EMULATION_PROGRESS: "random" (the default) or "latest": queued work runs only when
// something needs it, the latest moment CUDA allows, so that every missing wait for another
// stream reads stale data (random progress lets a lagging stream catch up by chance).
bool random_progress_from_environment() {
  const char* text = std::getenv("L3_EMULATION_PROGRESS");
  if (text == nullptr || *text == '\0' || std::strcmp(text, "random") == 0) return true;
  if (std::strcmp(text, "latest") == 0) return false;
  std::fprintf(stderr, "L3_EMULATION_PROGRESS=%s: expected random or latest\n", text);
  std::abort();
}

bool g_random_progress = random_progress_from_environment();

void make_progress() {
  static bool busy = false;  // an operation run from here enqueues nothing, but be sure
  if (!g_random_progress || busy || next_random() >> 63U == 0U) return;
  std::vector<Stream*> waiting;
  if (!legacy_stream().pending.empty()) waiting.push_back(&legacy_stream());
  for (Stream* s : streams().all) {
    if (!s->pending.empty()) waiting.push_back(s);
  }
  if (waiting.empty()) return;
  Stream& s = *waiting[(next_random() >> 32U) % waiting.size()];
  busy = true;
  try {
    drain(s, s.executed + 1);
  } catch (...) {
    busy = false;
    throw;
  }
  busy = false;
}

// Legacy default-stream semantics: work on the null stream waits for every blocking stream's
// queued work, and work on a blocking stream waits for the null stream's.
void enqueue_on(Stream& s, std::function<void()> op) {
  if (s.capture != nullptr) {  // recorded, not run
    s.capture->work->push_back(std::move(op));
    return;
  }
  Stream& legacy = legacy_stream();
  if (&s == &legacy) {
    for (Stream* other : streams().all) {
      if (!other->blocking) continue;
      const std::uint64_t at = other->enqueued;
      push(s, [other, at] { drain(*other, at); });
    }
  } else if (s.blocking && legacy.enqueued > legacy.executed) {
    const std::uint64_t at = legacy.enqueued;
    push(s, [&legacy, at] { drain(legacy, at); });
  }
  push(s, std::move(op));
  make_progress();
}

// The kind of memory p points into: device or pinned host (cudaHostAlloc) memory, or
// cudaMemoryTypeUnregistered for pageable host memory (no allocation of the emulation's).
cudaMemoryType memory_type(const void* p) {
  Runtime& r = runtime();
  const std::lock_guard lock(r.mutex);
  const auto* c = static_cast<const char*>(p);
  auto it = r.allocations.upper_bound(c);
  if (it == r.allocations.begin()) return cudaMemoryTypeUnregistered;
  --it;
  if (c >= it->first + std::max<std::size_t>(it->second.bytes, 1))
    return cudaMemoryTypeUnregistered;
  return it->second.type;
}

bool pageable(const void* p) { return memory_type(p) == cudaMemoryTypeUnregistered; }

cudaError_t capture_violation(cudaError_t error, Stream* stream) {
  if (stream != nullptr && stream->capture != nullptr) stream->capture->invalidated = true;
  if (stream == nullptr) {
    for (Stream* s : capturing()) s->capture->invalidated = true;
  }
  return fail(error);
}

// Whether a call that CUDA refuses during a capture (outside relaxed mode) must fail: some stream
// is capturing in a strict mode.
bool strict_capture_active() {
  for (const Stream* s : capturing()) {
    if (!s->capture->relaxed) return true;
  }
  return false;
}

}  // namespace

namespace l3emu {
void enqueue(cudaStream_t stream, std::function<void()> work) {
  enqueue_on(*stream_of(stream), std::move(work));
}
bool set_random_progress(bool on) { return std::exchange(g_random_progress, on); }
bool random_choice() { return g_random_progress && next_random() >> 63U != 0U; }
}  // namespace l3emu

extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t e = runtime().last_error;
  runtime().last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return runtime().last_error; }
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureIsolation:
      return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit:
      return "cudaErrorStreamCaptureImplicit";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    default:
      return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : cudaGetErrorName(error);
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = runtime().device_count;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "llama3-hpc CUDA emulation (CPU)", sizeof(prop->name) - 1);
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
                         static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  prop->multiProcessorCount = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->sharedMemPerBlock = 48 * 1024;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  switch (attribute) {
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    default:
      *value = 0;
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int length, int device) {
  if (!valid_device(device) || length < 1) return fail(cudaErrorInvalidValue);
  std::snprintf(id, static_cast<std::size_t>(length), "0000:%02x:00.0", device);
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (!capturing().empty()) return capture_violation(cudaErrorStreamCaptureUnsupported);
  drain_device();
  return cudaSuccess;
}

// The device's memory is the host's (as cudaGetDeviceProperties says); free is that less what
// this process holds on the current device.
cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total) {
  const std::size_t capacity = static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
                               static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  Runtime& r = runtime();
  const std::lock_guard lock(r.mutex);
  std::size_t held = 0;
  for (const auto& [base, a] : r.allocations)
    if (a.type == cudaMemoryTypeDevice && a.device == current_device) held += a.bytes;
  if (total != nullptr) *total = capacity;
  if (free != nullptr) *free = capacity - std::min(held, capacity);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** pointer, std::size_t bytes) {
  if (strict_capture_active()) return capture_violation(cudaErrorStreamCaptureUnsupported);
  return allocate(pointer, bytes, cudaMemoryTypeDevice);
}
cudaError_t cudaFree(void* pointer) {
  if (strict_capture_active()) return capture_violation(cudaErrorStreamCaptureUnsupported);
  drain_device();  // cudaFree waits for the device's queued work
  return release(pointer, cudaMemoryTypeDevice);
}
cudaError_t cudaHostAlloc(void** pointer, std::size_t bytes, unsigned int /*flags*/) {
  if (strict_capture_active()) return capture_violation(cudaErrorStreamCaptureUnsupported);
  return allocate(pointer, bytes, cudaMemoryTypeHost);
}
cudaError_t cudaMallocHost(void** pointer, std::size_t bytes) {
  if (strict_capture_active()) return capture_violation(cudaErrorStreamCaptureUnsupported);
  return allocate(pointer, bytes, cudaMemoryTypeHost);
}
cudaError_t cudaFreeHost(void* pointer) {
  if (strict_capture_active()) return capture_violation(cudaErrorStreamCaptureUnsupported);
  drain_device();
  return release(pointer, cudaMemoryTypeHost);
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* pointer) {
  *attributes = cudaPointerAttributes{};
  attributes->type = cudaMemoryTypeUnregistered;
  Runtime& r = runtime();
  const std::lock_guard lock(r.mutex);
  const auto* p = static_cast<const char*>(pointer);
  auto it = r.allocations.upper_bound(p);
  if (it != r.allocations.begin()) {
    --it;
    if (p < it->first + std::max<std::size_t>(it->second.bytes, 1)) {
      attributes->type = it->second.type;
      attributes->device = it->second.device;
      attributes->devicePointer = const_cast<char*>(it->first);
      attributes->hostPointer =
          it->second.type == cudaMemoryTypeHost ? attributes->devicePointer : nullptr;
    }
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind /*kind*/,
                            cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  Stream& s = *stream_of(stream);
  // A copy to or from pageable memory synchronises: not in a graph.
  if (s.capture != nullptr && (pageable(dst) || pageable(src))) {
    return capture_violation(cudaErrorStreamCaptureUnsupported, &s);
  }
  if (pageable(dst)) {
    // To pageable memory: returns once the copy is done, in order with the stream.
    drain_all(s);
    std::memmove(dst, src, bytes);
  } else if (pageable(src)) {
    // From pageable memory: the stream's earlier work first, the source read before returning.
    drain_all(s);
    std::vector<unsigned char> staged(static_cast<const unsigned char*>(src),
                                      static_cast<const unsigned char*>(src) + bytes);
    enqueue_on(
        s, [dst, staged = std::move(staged)] { std::memcpy(dst, staged.data(), staged.size()); });
  } else {
    enqueue_on(s, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (!capturing().empty()) return capture_violation(cudaErrorStreamCaptureUnsupported);
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  drain_all(legacy_stream());
  return e;
}
cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream) {
  if (bytes != 0)
    enqueue_on(*stream_of(stream), [dst, value, bytes] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) {
  // CUDA: "asynchronous with respect to the host except when the target is pinned host memory",
  // on the legacy default stream, which streams created with cudaStreamNonBlocking do not wait for.
  const cudaError_t e = cudaMemsetAsync(dst, value, bytes, nullptr);
  if (memory_type(dst) != cudaMemoryTypeDevice) drain_all(legacy_stream());
  return e;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  auto* s = new Stream{};
  s->priority = priority;
  s->blocking = (flags & cudaStreamNonBlocking) == 0U;
  streams().all.insert(s);
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithPriority(stream, cudaStreamDefault, 0);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Stream* s = stream_of(stream);
  if (s->capture != nullptr) return capture_violation(cudaErrorStreamCaptureUnsupported, s);
  drain_device();  // CUDA lets queued work finish (and the null stream may wait on this one)
  // Kept, empty: events recorded on it stay valid to wait for and synchronise with.
  streams().all.erase(s);
  streams().retired.emplace_back(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Stream& s = *stream_of(stream);
  if (s.capture != nullptr) return capture_violation(cudaErrorStreamCaptureUnsupported, &s);
  drain_all(s);
  return cudaSuccess;
}
// Not done yet while work is queued; each query lets the stream's oldest operation run (with what
// it waits for), as a GPU makes progress between a host's polls.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Stream& s = *stream_of(stream);
  if (s.capture != nullptr) return capture_violation(cudaErrorStreamCaptureUnsupported, &s);
  if (s.executed == s.enqueued) return cudaSuccess;
  drain(s, s.executed + 1);
  return cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int /*flags*/) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (stream_of(stream)->capture != nullptr) {
    return capture_violation(cudaErrorStreamCaptureIsolation, stream_of(stream));
  }
  const auto* e = reinterpret_cast<const Event*>(event);
  if (e->stream == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  Stream* target = e->stream;
  const std::uint64_t at = e->position;
  enqueue_on(*stream_of(stream), [target, at] { drain(*target, at); });
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  auto* e = new Event{};
  e->timing = (flags & cudaEventDisableTiming) == 0U;
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  auto* e = reinterpret_cast<Event*>(event);
  if (e != nullptr && e->stream != nullptr && !e->recorded) drain(*e->stream, e->position);
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  auto* e = reinterpret_cast<Event*>(event);
  Stream& s = *stream_of(stream);
  if (s.capture != nullptr) return capture_violation(cudaErrorStreamCaptureUnsupported, &s);
  e->recorded = false;
  enqueue_on(s, [e] {
    e->time = std::chrono::steady_clock::now();
    e->recorded = true;
  });
  e->stream = &s;
  e->position = s.enqueued;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  const auto* e = reinterpret_cast<const Event*>(event);
  if (e->stream != nullptr) drain(*e->stream, e->position);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  return cudaEventSynchronize(event);  // asked, it completes: a poll loop always ends
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const auto* a = reinterpret_cast<const Event*>(start);
  const auto* b = reinterpret_cast<const Event*>(end);
  if (a == nullptr || b == nullptr || !a->timing || !b->timing) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (!a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr) return fail(cudaErrorInvalidValue);
  *mode = cudaStreamCaptureModeThreadLocal;  // modes per thread are not modelled
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (stream == nullptr) return fail(cudaErrorStreamCaptureImplicit);  // the legacy stream
  Stream& s = *stream_of(stream);
  if (s.capture != nullptr) return fail(cudaErrorIllegalState);
  s.capture = new Graph{};
  s.capture->relaxed = mode == cudaStreamCaptureModeRelaxed;
  capturing().insert(&s);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  Stream& s = *stream_of(stream);
  if (s.capture == nullptr) return fail(cudaErrorIllegalState);
  std::unique_ptr<Graph> captured(std::exchange(s.capture, nullptr));
  capturing().erase(&s);
  *graph = nullptr;
  if (captured->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  *graph = reinterpret_cast<cudaGraph_t>(captured.release());
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  const Stream& s = *stream_of(stream);
  *status = s.capture == nullptr     ? cudaStreamCaptureStatusNone
            : s.capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                     : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long /*flags*/) {
  if (exec == nullptr || graph == nullptr) return fail(cudaErrorInvalidValue);
  const auto* g = reinterpret_cast<const Graph*>(graph);
  // A snapshot: instantiating copies the graph, later changes to it do not reach the exec.
  auto* e = new GraphExec{std::make_shared<const std::vector<std::function<void()>>>(*g->work)};
  *exec = reinterpret_cast<cudaGraphExec_t>(e);
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return fail(cudaErrorInvalidResourceHandle);
  const auto* e = reinterpret_cast<const GraphExec*>(exec);
  // The recorded work in its order, as one operation of the stream (a graph launched in a
  // capture is recorded as that operation, as CUDA records a child graph).
  enqueue_on(*stream_of(stream), [work = e->work] {
    for (const std::function<void()>& op : *work) op();
  });
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<GraphExec*>(exec);  // a queued launch keeps its work alive
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<Graph*>(graph);
  return cudaSuccess;
}

}  // extern "C"
