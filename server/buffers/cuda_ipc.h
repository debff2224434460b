// The real IpcOpener: cudaIpcOpenMemHandle / cudaIpcCloseMemHandle, and cudaIpcOpenEventHandle /
// cudaEventDestroy, on one device.
#pragma once

#include "server/buffers/buffer_registry.h"

namespace probesidecar::server {

class CudaIpcOpener final : public IpcOpener {
 public:
  explicit CudaIpcOpener(int device) : device_(device) {}
  absl::StatusOr<Mapping> Open(const IpcHandleBytes& handle) override;
  void Close(void* base) override;
  absl::StatusOr<void*> OpenEvent(const IpcHandleBytes& handle) override;
  void CloseEvent(void* event) override;

 private:
  const int device_;
};

}  // namespace probesidecar::server
