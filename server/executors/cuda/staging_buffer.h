// A buffer of a stream slot's runner that grows on demand: device memory, pinned host memory, or
// pinned host memory mapped into the device. Growing frees the old allocation (whatever holds its
// address, e.g. a captured graph, must be dropped first) and at least doubles, from `min_bytes`,
// so that a slot settles after a few requests. Device bytes are counted in the executor's ledger.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace probesidecar::server {

class StagingBuffer {
 public:
  enum class Kind : uint8_t { kDevice, kPinned, kMapped };

  // `device_bytes` (device buffers only) outlives the buffer.
  StagingBuffer(Kind kind, std::atomic<int64_t>* device_bytes, size_t min_bytes = size_t{1} << 20)
      : kind_(kind), device_bytes_(device_bytes), min_bytes_(min_bytes) {}
  ~StagingBuffer() { Free(); }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  // Grows to at least `bytes` (no-op when it holds that much); the contents are not kept. On an
  // error the buffer is empty.
  cudaError_t Reserve(size_t bytes);
  // Frees the allocation (when the device is quiet: a pending copy may still read it).
  void Free();

  void* ptr() const { return ptr_; }
  // A mapped buffer's address on the device (nullptr for the other kinds).
  void* device_alias() const { return device_alias_; }
  size_t bytes() const { return bytes_; }

 private:
  const Kind kind_;
  std::atomic<int64_t>* const device_bytes_;
  const size_t min_bytes_;
  void* ptr_ = nullptr;
  void* device_alias_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace probesidecar::server
