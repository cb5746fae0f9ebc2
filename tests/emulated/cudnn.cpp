// cuDNN for the emulated build: handles and backend descriptors exist, but the emulation has no
// engines: finalising an operation graph is refused (CUDNN_STATUS_NOT_SUPPORTED), which the
// backend treats like any configuration cuDNN declines: it runs its fallback attention.
#include <cudnn.h>

#include <cstring>

struct cudnnContext {};

namespace {

constexpr const char* kNoEngines = "the llama3-hpc CUDA emulation has no cuDNN engines";

struct Descriptor {
  cudnnBackendDescriptorType_t type;
};

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

}  // extern "C"
