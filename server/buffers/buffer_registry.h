// Registered CUDA IPC buffers: windows (offset, size) of allocations that live in the caller's
// process, opened once per allocation and reference-counted, leased per request.
//
// A process can open a given allocation only once, and PyTorch packs many tensors into one
// cudaMalloc block, so registrations naming the same allocation share one mapping. A buffer that
// is unregistered while requests use it closes when the last of them finishes. Registrations
// made under a session (OpenSession) are released when the session ends — when the client
// process exits, its connection breaks and the session with it — so a restarted inference
// server's memory is not kept pinned by our mappings.
//
// The registry also holds the sessions' CUDA IPC events (GPU-side ordering): opened once, named by
// id in requests, usable only by their own session.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "probesidecar/v1/buffers.pb.h"
#include "server/buffers/buffer_lease.h"
#include "server/buffers/ipc_handle.h"

namespace probesidecar::server {

// Opens and closes IPC allocations: CUDA in the server (cuda_ipc.h), a fake in tests.
class IpcOpener {
 public:
  struct Mapping {
    void* base = nullptr;
    uint64_t size = 0;  // bytes of the whole allocation
  };
  virtual ~IpcOpener() = default;
  // INVALID_ARGUMENT when the handle cannot be opened (stale, foreign, wrong device).
  virtual absl::StatusOr<Mapping> Open(const IpcHandleBytes& handle) = 0;
  virtual void Close(void* base) = 0;
  // The same for a cudaIpcEventHandle_t: the opened cudaEvent_t.
  virtual absl::StatusOr<void*> OpenEvent(const IpcHandleBytes& handle) = 0;
  virtual void CloseEvent(void* event) = 0;
};

struct BufferCounters {
  uint64_t registrations = 0;
  uint64_t registered_bytes = 0;
  uint64_t open_handles = 0;
  uint64_t sessions = 0;
  uint64_t events = 0;
};

struct BufferRegistryLimits {
  uint32_t max_registrations = 4096;               // buffers and events, each
  uint64_t max_session_bytes = uint64_t{1} << 40;  // bytes of windows per session
  bool allow_sessionless = false;  // buffers registered without a session (usable by anyone)
};

class BufferRegistry final : public BufferResolver {
 public:
  BufferRegistry(int device, IpcOpener* opener, BufferRegistryLimits limits = {});
  // Closes every mapping; no lease may outlive the registry.
  ~BufferRegistry() override;

  // INVALID_ARGUMENT for bad handles, sizes, windows or devices, and for a missing session
  // (unless sessionless buffers are allowed); UNIMPLEMENTED for PyTorch expandable-segment
  // handles; NOT_FOUND for unknown sessions; RESOURCE_EXHAUSTED past the registration limit or
  // the session's byte limit.
  absl::StatusOr<v1::RegisterBufferResponse> Register(const v1::RegisterBufferRequest& request);
  // Returns true when deferred (requests still use it). NOT_FOUND when unknown or already closing;
  // PERMISSION_DENIED for a buffer of another session.
  absl::StatusOr<bool> Unregister(uint64_t buffer_id, uint64_t session_id);
  std::vector<v1::BufferInfo> List() const;

  absl::StatusOr<BufferLease> Acquire(uint64_t buffer_id, uint64_t offset_bytes,
                                      uint64_t extent_bytes, uint64_t session_id) override;

  // CUDA IPC events (GPU-side ordering), owned by a session. INVALID_ARGUMENT for bad handles
  // or devices, NOT_FOUND for a session that is not open, RESOURCE_EXHAUSTED past the limit.
  absl::StatusOr<uint64_t> RegisterEvent(const v1::RegisterEventRequest& request);
  // NOT_FOUND when unknown, PERMISSION_DENIED when it belongs to another session. Requests that
  // hold the event keep it open until they end.
  absl::Status UnregisterEvent(uint64_t event_id, uint64_t session_id);
  absl::StatusOr<EventLease> AcquireEvent(uint64_t event_id, uint64_t session_id) override;

  uint64_t OpenSession(int64_t client_pid);
  // Releases every registration and event of the session (deferred where in use).
  void CloseSession(uint64_t session_id);

  BufferCounters counters() const;

 private:
  struct Mapping {
    IpcHandleBytes handle;
    void* base = nullptr;
    uint64_t size = 0;
    int refs = 0;
  };
  struct Registration {
    std::string name;
    int64_t client_pid = 0;
    uint64_t session_id = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
    Mapping* mapping = nullptr;
    uint32_t in_flight = 0;
    bool closing = false;
  };

  // Drops one lease of `buffer_id`; completes a deferred unregister.
  void Release(uint64_t buffer_id);
  v1::RegisterBufferResponse AddLocked(const v1::RegisterBufferRequest& request, Mapping* mapping)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a registration; true when its mapping is now unused (call CloseUnused).
  bool RemoveLocked(uint64_t buffer_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes now, or marks for removal when in use (*deferred); true as RemoveLocked.
  bool UnregisterLocked(uint64_t buffer_id, bool* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes every mapping no registration uses.
  void CloseUnused() ABSL_LOCKS_EXCLUDED(mu_, open_mu_);

  // Bytes of windows `session_id` has registered.
  uint64_t SessionBytesLocked(uint64_t session_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int device_;
  IpcOpener* const opener_;
  const BufferRegistryLimits limits_;
  // Serialises opening and closing allocations (slow CUDA calls) without holding mu_, which the
  // request path takes.
  absl::Mutex open_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  uint64_t next_buffer_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Registration> registrations_ ABSL_GUARDED_BY(mu_);
  std::map<IpcHandleBytes, std::unique_ptr<Mapping>> mappings_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, int64_t> sessions_ ABSL_GUARDED_BY(mu_);  // id -> client pid
  // An opened event; closed when the registry and every request have let go of it.
  struct Event {
    void* event = nullptr;
    uint64_t session_id = 0;
  };
  uint64_t next_event_id_ ABSL_GUARDED_BY(mu_) = 1;
  using EventMap = std::map<uint64_t, std::shared_ptr<Event>>;
  // The event, if it is registered and belongs to `session_id`.
  absl::StatusOr<EventMap::iterator> FindEvent(uint64_t event_id, uint64_t session_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  EventMap events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace probesidecar::server
