#include "tests/fuzz/fake_ipc_opener.h"

#include <algorithm>

#include "tests/fuzz/fuzz_check.h"

namespace probesidecar::fuzz {

FakeIpcOpener::~FakeIpcOpener() = default;

absl::StatusOr<server::IpcOpener::Mapping> FakeIpcOpener::Open(const server::IpcHandleBytes& handle,
                                                               int /*device*/) {
  // cudaIpcOpenMemHandle refuses a second open of the same allocation in one process.
  if (open_handles_.contains(handle)) return absl::InvalidArgumentError("already open");
  if (handle[0] == 'X') return absl::InvalidArgumentError("handle: cannot open");
  const uint64_t size = size_of_(handle);
  Allocation allocation{handle, std::make_unique<char[]>(size)};
  std::fill_n(allocation.bytes.get(), size, '\x5a');
  Mapping mapping{allocation.bytes.get(), size};
  allocations_.emplace(mapping.base, std::move(allocation));
  open_handles_.insert(handle);
  return mapping;
}

void FakeIpcOpener::Close(void* base, int /*device*/) {
  auto it = allocations_.find(base);
  FUZZ_CHECK(it != allocations_.end());  // closing what is not open
  open_handles_.erase(it->second.handle);
  allocations_.erase(it);
}

absl::StatusOr<void*> FakeIpcOpener::OpenEvent(const server::IpcHandleBytes& handle,
                                               int /*device*/) {
  if (handle[0] == 'X') return absl::InvalidArgumentError("handle: cannot open event");
  void* event = reinterpret_cast<void*>(next_event_++);
  events_.insert(event);
  return event;
}

void FakeIpcOpener::CloseEvent(void* event, int /*device*/) {
  FUZZ_CHECK(events_.erase(event) == 1);  // destroying an event that is not open
}

}  // namespace probesidecar::fuzz
