// The CUDA runtime calls of the backend, on the host, for the emulated build (L3_CUDA=EMULATED):
// one device ("llama3-hpc CUDA emulation"), device memory from the host heap (tracked, so that
// cudaPointerGetAttributes can tell device from host), streams and events as handles. Kernel
// launches run to completion when they are made (cuda_emulation.hpp), so every stream is always
// idle: copies and memsets happen at once, waits and synchronisations return at once, and an
// event records the time it was recorded (cudaEventElapsedTime measures host time between).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>

namespace {

constexpr std::size_t kAlignment = 256;  // what cudaMalloc guarantees

struct Allocation {
  std::size_t bytes;
  cudaMemoryType type;
};

struct Runtime {
  std::mutex mutex;
  std::map<const char*, Allocation> allocations;  // base address -> extent
  cudaError_t last_error = cudaSuccess;
  int device = 0;
};

Runtime& runtime() {
  static Runtime r;
  return r;
}

cudaError_t fail(cudaError_t error) {
  runtime().last_error = error;
  return error;
}

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
  r.allocations[static_cast<const char*>(p)] = {bytes, type};
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

struct Stream {
  int priority = 0;
};
struct Event {
  std::chrono::steady_clock::time_point time;
  bool recorded = false;
  bool timing = true;
};

}  // namespace

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
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = runtime().device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  runtime().device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
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
  if (device != 0) return fail(cudaErrorInvalidDevice);
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
  if (device != 0 || length < 1) return fail(cudaErrorInvalidValue);
  std::strncpy(id, "0000:00:00.0", static_cast<std::size_t>(length) - 1);
  id[length - 1] = '\0';
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMalloc(void** pointer, std::size_t bytes) {
  return allocate(pointer, bytes, cudaMemoryTypeDevice);
}
cudaError_t cudaFree(void* pointer) { return release(pointer, cudaMemoryTypeDevice); }
cudaError_t cudaHostAlloc(void** pointer, std::size_t bytes, unsigned int /*flags*/) {
  return allocate(pointer, bytes, cudaMemoryTypeHost);
}
cudaError_t cudaMallocHost(void** pointer, std::size_t bytes) {
  return allocate(pointer, bytes, cudaMemoryTypeHost);
}
cudaError_t cudaFreeHost(void* pointer) { return release(pointer, cudaMemoryTypeHost); }
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
      attributes->device = 0;
      attributes->devicePointer = const_cast<char*>(it->first);
      attributes->hostPointer =
          it->second.type == cudaMemoryTypeHost ? attributes->devicePointer : nullptr;
    }
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind /*kind*/) {
  if (bytes != 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t /*stream*/) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) {
  if (bytes != 0) std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t /*stream*/) {
  return cudaMemset(dst, value, bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = reinterpret_cast<cudaStream_t>(new Stream{});
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int /*flags*/) {
  return cudaStreamCreate(stream);
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int /*flags*/,
                                         int priority) {
  *stream = reinterpret_cast<cudaStream_t>(new Stream{priority});
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<Stream*>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t /*stream*/) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t /*stream*/, cudaEvent_t event,
                                unsigned int /*flags*/) {
  return event == nullptr ? fail(cudaErrorInvalidResourceHandle) : cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new Event{});
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  auto* e = new Event{};
  e->timing = (flags & cudaEventDisableTiming) == 0U;
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t /*stream*/) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  auto* e = reinterpret_cast<Event*>(event);
  e->time = std::chrono::steady_clock::now();
  e->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return event == nullptr ? fail(cudaErrorInvalidResourceHandle) : cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  return event == nullptr ? fail(cudaErrorInvalidResourceHandle) : cudaSuccess;
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

}  // extern "C"
