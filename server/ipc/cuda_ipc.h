// The real IpcOpener: cudaIpcOpenMemHandle / cudaIpcCloseMemHandle, and cudaIpcOpenEventHandle /
// cudaEventDestroy, on the device each registration names.
#pragma once

#include "server/ipc/ipc_opener.h"

namespace probesidecar::server {

class CudaIpcOpener final : public IpcOpener {
 public:
  absl::StatusOr<Mapping> Open(const IpcHandleBytes& handle, int device) override;
  void Close(void* base, int device) override;
  absl::StatusOr<void*> OpenEvent(const IpcHandleBytes& handle, int device) override;
  void CloseEvent(void* event, int device) override;
};

}  // namespace probesidecar::server
