// Registered CUDA IPC events (GPU-side ordering): opened once, on the device the registration
// names, owned by a session, named by id in requests and usable only by their own session. A
// request holds its events open until it ends, also past an unregister or the session's end.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/ipc/buffer_lease.h"
#include "server/ipc/ipc_opener.h"
#include "server/sessions/session_table.h"

namespace probesidecar::server {

// What a client asks to register: a cudaIpcEventHandle_t of an event made with
// cudaEventInterprocess | cudaEventDisableTiming.
struct EventRegistration {
  std::string name;
  std::optional<int> device;  // unset: the only served device (refused when there are several)
  std::string handle;
  uint64_t session_id = 0;
};

class EventRegistry final {
 public:
  // `devices`: the served CUDA devices; `sessions` and `opener` outlive the registry.
  EventRegistry(std::vector<int> devices, const SessionTable* sessions, IpcOpener* opener,
                uint32_t max_events = 4096);
  ~EventRegistry();

  // INVALID_ARGUMENT for bad handles or devices and for a missing session, NOT_FOUND for a
  // session that is not open, RESOURCE_EXHAUSTED past the limit.
  absl::StatusOr<uint64_t> Register(const EventRegistration& request);
  // NOT_FOUND when unknown, PERMISSION_DENIED when it belongs to another session.
  absl::Status Unregister(uint64_t event_id, uint64_t session_id);
  absl::StatusOr<EventLease> Acquire(uint64_t event_id, uint64_t session_id);
  // Releases every event of the session (closed once no request holds it).
  void CloseSession(uint64_t session_id);

  uint64_t size() const;
  uint64_t size(int device) const;

 private:
  // An opened event; closed when the registry and every request have let go of it.
  struct Event {
    void* event = nullptr;
    uint64_t session_id = 0;
    int device = 0;
  };
  using EventMap = std::map<uint64_t, std::shared_ptr<Event>>;
  // The event, if it is registered and belongs to `session_id`.
  absl::StatusOr<EventMap::iterator> FindLocked(uint64_t event_id, uint64_t session_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<int> devices_;
  const SessionTable* const sessions_;
  IpcOpener* const opener_;
  const uint32_t max_events_;
  mutable absl::Mutex mu_;
  uint64_t next_event_id_ ABSL_GUARDED_BY(mu_) = 1;
  EventMap events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace probesidecar::server
