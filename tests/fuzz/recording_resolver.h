// A BufferResolver that forwards to the real registry and remembers every window it leased, so
// that a fuzz target can check that validation leased at least every byte a kernel will touch
// (an extent computed independently from the job's shape and strides) — a window that is too
// short by a few bytes is otherwise invisible whenever it does not end at its allocation's end.
#pragma once

#include <cstdint>
#include <vector>

#include "server/ipc/buffer_lease.h"
#include "tests/fuzz/fuzz_check.h"

namespace probesidecar::fuzz {

class RecordingResolver final : public server::BufferResolver {
 public:
  explicit RecordingResolver(server::BufferResolver* inner) : inner_(inner) {}

  absl::StatusOr<server::BufferLease> Acquire(uint64_t buffer_id, uint64_t offset_bytes,
                                              uint64_t extent_bytes, uint64_t session_id) override {
    absl::StatusOr<server::BufferLease> lease =
        inner_->Acquire(buffer_id, offset_bytes, extent_bytes, session_id);
    if (lease.ok()) windows_.push_back({static_cast<const char*>(lease->device_ptr), extent_bytes});
    return lease;
  }
  absl::StatusOr<server::EventLease> AcquireEvent(uint64_t event_id, uint64_t session_id) override {
    return inner_->AcquireEvent(event_id, session_id);
  }

  // Traps unless [ptr, ptr + bytes) lies in one window leased since the last Clear().
  void CheckLeased(const void* ptr, uint64_t bytes) const {
    const char* p = static_cast<const char*>(ptr);
    bool covered = false;
    for (const Window& w : windows_) {
      covered |= p >= w.begin && static_cast<uint64_t>(p - w.begin) <= w.bytes &&
                 bytes <= w.bytes - static_cast<uint64_t>(p - w.begin);
    }
    FUZZ_CHECK(covered);
  }
  void Clear() { windows_.clear(); }

 private:
  struct Window {
    const char* begin;
    uint64_t bytes;
  };
  server::BufferResolver* inner_;
  std::vector<Window> windows_;
};

}  // namespace probesidecar::fuzz
