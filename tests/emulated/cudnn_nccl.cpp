// cuDNN and NCCL for the emulated build. cuDNN: handles and backend descriptors exist, but the
// emulation has no engines: finalising an operation graph is refused (CUDNN_STATUS_NOT_SUPPORTED),
// which the backend treats like any configuration cuDNN declines: it runs its fallback
// attention. NCCL: communicators of one rank (the data moves as plain copies); more ranks are
// refused, and the trainer's MPI exchange serves them.
#include <cudnn.h>
#include <nccl.h>

#include <cstring>
#include <map>

#include "cuda_emulation.hpp"

struct cudnnContext {};
struct ncclComm {
  int ranks = 1;
};

namespace {

constexpr const char* kNoEngines = "the llama3-hpc CUDA emulation has no cuDNN engines";

struct Descriptor {
  cudnnBackendDescriptorType_t type;
};

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

// One rank: every collective is a copy, queued on its stream.
ncclResult_t copy(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                  ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr) return ncclInvalidArgument;
  const std::size_t bytes = count * nccl_size(type);
  if (send != recv && count != 0) {
    l3emu::enqueue(stream, [send, recv, bytes] { std::memmove(recv, send, bytes); });
  }
  return ncclSuccess;
}

}  // namespace

extern "C" {

std::size_t cudnnGetVersion() { return CUDNN_VERSION; }
const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    default:
      return "CUDNN_STATUS (emulated)";
  }
}
void cudnnGetLastErrorString(char* message, std::size_t max) {
  if (max == 0) return;
  std::strncpy(message, kNoEngines, max - 1);
  message[max - 1] = '\0';
}
cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  *handle = new cudnnContext{};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t /*handle*/, cudaStream_t /*stream*/) {
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* descriptor) {
  *descriptor = new Descriptor{type};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  delete static_cast<Descriptor*>(descriptor);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t /*name*/,
                                       cudnnBackendAttributeType_t /*type*/, int64_t /*count*/,
                                       const void* /*values*/) {
  return descriptor == nullptr ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const /*descriptor*/,
                                       cudnnBackendAttributeName_t /*name*/,
                                       cudnnBackendAttributeType_t /*type*/, int64_t /*requested*/,
                                       int64_t* count, void* /*values*/) {
  if (count != nullptr) *count = 0;
  return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  const auto* d = static_cast<const Descriptor*>(descriptor);
  if (d == nullptr) return CUDNN_STATUS_BAD_PARAM;
  return d->type == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR ? CUDNN_STATUS_NOT_SUPPORTED
                                                            : CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t /*handle*/, cudnnBackendDescriptor_t /*plan*/,
                                  cudnnBackendDescriptor_t /*variant_pack*/) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error"
                               : "refused by the llama3-hpc CUDA emulation (one rank only)";
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  *id = ncclUniqueId{};
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int ranks, ncclUniqueId /*id*/, int rank) {
  if (ranks != 1 || rank != 0) return ncclInvalidUsage;
  *comm = new ncclComm{};
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t /*comm*/, ncclResult_t* error) {
  *error = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }
ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return copy(send, recv, count, type, comm, stream);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                               ncclRedOp_t /*op*/, ncclComm_t comm, cudaStream_t stream) {
  return copy(send, recv, count, type, comm, stream);
}
ncclResult_t ncclReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                        ncclRedOp_t /*op*/, int root, ncclComm_t comm, cudaStream_t stream) {
  return root == 0 ? copy(send, recv, count, type, comm, stream) : ncclInvalidArgument;
}
ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return root == 0 ? copy(send, recv, count, type, comm, stream) : ncclInvalidArgument;
}

}  // extern "C"
