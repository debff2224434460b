// An IpcOpener for fuzz targets: each distinct handle is an allocation of real host memory, so
// that a lease's window can be read and written and AddressSanitizer sees any byte outside it.
// It refuses what CUDA refuses (a handle opened twice) and traps on what CUDA would corrupt
// (closing something that is not open).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>

#include "server/ipc/ipc_opener.h"

namespace probesidecar::fuzz {

class FakeIpcOpener final : public server::IpcOpener {
 public:
  // The allocation behind `handle` is `size_of(handle)` bytes.
  using SizeFn = uint64_t (*)(const server::IpcHandleBytes& handle);
  explicit FakeIpcOpener(SizeFn size_of) : size_of_(size_of) {}
  ~FakeIpcOpener() override;

  absl::StatusOr<Mapping> Open(const server::IpcHandleBytes& handle, int device) override;
  void Close(void* base, int device) override;
  absl::StatusOr<void*> OpenEvent(const server::IpcHandleBytes& handle, int device) override;
  void CloseEvent(void* event, int device) override;

  size_t open_allocations() const { return allocations_.size(); }
  size_t open_events() const { return events_.size(); }

 private:
  struct Allocation {
    server::IpcHandleBytes handle;
    std::unique_ptr<char[]> bytes;
  };
  SizeFn size_of_;
  std::map<void*, Allocation> allocations_;
  std::set<server::IpcHandleBytes> open_handles_;
  std::set<void*> events_;
  uintptr_t next_event_ = 0x1000;
};

}  // namespace probesidecar::fuzz
