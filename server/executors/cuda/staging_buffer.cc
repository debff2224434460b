#include "server/executors/cuda/staging_buffer.h"

#include <algorithm>

namespace probesidecar::server {

void StagingBuffer::Free() {
  if (ptr_ != nullptr) {
    if (kind_ == Kind::kDevice) {
      cudaFree(ptr_);
      if (device_bytes_ != nullptr) *device_bytes_ -= static_cast<int64_t>(bytes_);
    } else {
      cudaFreeHost(ptr_);
    }
  }
  ptr_ = nullptr;
  device_alias_ = nullptr;
  bytes_ = 0;
}

cudaError_t StagingBuffer::Reserve(size_t bytes) {
  if (bytes <= bytes_) return cudaSuccess;
  size_t grown = std::max<size_t>({bytes_ * 2, min_bytes_, 1});
  while (grown < bytes) grown *= 2;
  Free();
  void* ptr = nullptr;
  cudaError_t e = cudaSuccess;
  switch (kind_) {
    case Kind::kDevice:
      e = cudaMalloc(&ptr, grown);
      break;
    case Kind::kPinned:
      e = cudaHostAlloc(&ptr, grown, cudaHostAllocDefault);
      break;
    case Kind::kMapped:
      e = cudaHostAlloc(&ptr, grown, cudaHostAllocMapped);
      break;
  }
  if (e != cudaSuccess) return e;
  if (kind_ == Kind::kMapped) {
    if (cudaError_t m = cudaHostGetDevicePointer(&device_alias_, ptr, 0); m != cudaSuccess) {
      cudaFreeHost(ptr);
      device_alias_ = nullptr;
      return m;
    }
  }
  ptr_ = ptr;
  bytes_ = grown;
  if (kind_ == Kind::kDevice && device_bytes_ != nullptr) {
    *device_bytes_ += static_cast<int64_t>(grown);
  }
  return cudaSuccess;
}

}  // namespace probesidecar::server
