// The real IpcOpener: cudaIpcOpenMemHandle / cudaIpcCloseMemHandle on one device.
#pragma once

#include "server/buffers/buffer_registry.h"

namespace probesidecar::server {

class CudaIpcOpener final : public IpcOpener {
 public:
  explicit CudaIpcOpener(int device) : device_(device) {}
  absl::StatusOr<Mapping> Open(const IpcHandleBytes& handle) override;
  void Close(void* base) override;

 private:
  const int device_;
};

}  // namespace probesidecar::server
