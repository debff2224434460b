// Opens and closes CUDA IPC allocations and events on a device: CUDA in the server
// (cuda_ipc.h), a fake in tests.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "server/ipc/ipc_handle.h"

namespace probesidecar::server {

class IpcOpener {
 public:
  struct Mapping {
    void* base = nullptr;
    uint64_t size = 0;  // bytes of the whole allocation
  };
  virtual ~IpcOpener() = default;
  // Opens the allocation on CUDA device `device`. INVALID_ARGUMENT when the handle cannot be
  // opened (stale, foreign) or its allocation lives on another device.
  virtual absl::StatusOr<Mapping> Open(const IpcHandleBytes& handle, int device) = 0;
  virtual void Close(void* base, int device) = 0;
  // The same for a cudaIpcEventHandle_t: the opened cudaEvent_t.
  virtual absl::StatusOr<void*> OpenEvent(const IpcHandleBytes& handle, int device) = 0;
  virtual void CloseEvent(void* event, int device) = 0;
};

}  // namespace probesidecar::server
