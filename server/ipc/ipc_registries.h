// What the service owns for CUDA IPC (a backend on devices; none on the CPU backend): the
// registered buffers and the registered events of the open sessions (the service's, on every
// backend), over one opener, and the view request validation resolves TensorRefs and event ids
// through.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "server/ipc/buffer_lease.h"
#include "server/ipc/buffer_registry.h"
#include "server/ipc/event_registry.h"
#include "server/ipc/ipc_opener.h"
#include "server/sessions/session_table.h"

namespace probesidecar::server {

struct IpcRegistries final : public BufferResolver {
  // `devices`: the served CUDA devices, on which buffers and events may be registered; `sessions`
  // and `opener` outlive the registries.
  IpcRegistries(const std::vector<int>& devices, SessionTable* sessions, IpcOpener* opener,
                BufferRegistryLimits limits)
      : sessions(*sessions),
        buffers(devices, sessions, opener, limits),
        events(devices, sessions, opener, limits.max_registrations) {}

  // Ends a session: no new registration under it, then its buffers and events are released
  // (each closes once no request holds it). Driver work: not on a gRPC thread.
  void CloseSession(uint64_t session_id) {
    sessions.Close(session_id);
    buffers.CloseSession(session_id);
    events.CloseSession(session_id);
  }

  absl::StatusOr<BufferLease> Acquire(uint64_t buffer_id, uint64_t offset_bytes,
                                      uint64_t extent_bytes, uint64_t session_id) override {
    return buffers.Acquire(buffer_id, offset_bytes, extent_bytes, session_id);
  }
  absl::StatusOr<EventLease> AcquireEvent(uint64_t event_id, uint64_t session_id) override {
    return events.Acquire(event_id, session_id);
  }

  SessionTable& sessions;
  BufferRegistry buffers;
  EventRegistry events;
};

}  // namespace probesidecar::server
