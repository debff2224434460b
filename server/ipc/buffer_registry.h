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
// A buffer lives on one of the served CUDA devices, the one its registration names; its leases
// carry that device, so that a request runs where its buffers are. The API speaks plain types:
// the RPC layer converts the protos (server/rpc/proto_conversion.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/ipc/buffer_lease.h"
#include "server/ipc/ipc_handle.h"
#include "server/ipc/ipc_opener.h"
#include "server/sessions/session_table.h"

namespace probesidecar::server {

// What a client asks to register: a window [offset_bytes, offset_bytes + byte_size) of the
// allocation `handle` names (a raw or PyTorch-versioned cudaIpcMemHandle_t).
struct BufferRegistration {
  std::string name;
  std::optional<int> device;  // unset: the only served device (refused when there are several)
  uint64_t byte_size = 0;
  uint64_t offset_bytes = 0;
  std::string handle;
  int64_t client_pid = 0;
  uint64_t session_id = 0;  // 0: none (only with allow_sessionless)
};

struct RegisteredBuffer {
  uint64_t buffer_id = 0;
  uint64_t allocation_bytes = 0;
  bool shared_mapping = false;  // another registration had opened the allocation already
  int device = 0;
};

struct BufferListing {
  uint64_t buffer_id = 0;
  std::string name;
  int device = 0;
  uint64_t offset_bytes = 0;
  uint64_t byte_size = 0;
  uint64_t allocation_bytes = 0;
  int64_t client_pid = 0;
  uint64_t session_id = 0;
  uint32_t in_flight = 0;
  bool closing = false;
};

struct BufferCounters {
  uint64_t registrations = 0;
  uint64_t registered_bytes = 0;
  uint64_t open_handles = 0;
};

// The device a registration names, checked against the served `devices`: INVALID_ARGUMENT for a
// device that is not served, or for none when several are. `what` is "buffer" or "event".
absl::StatusOr<int> ResolveDevice(const std::optional<int>& device, const std::vector<int>& devices,
                                  const char* what);

struct BufferRegistryLimits {
  uint32_t max_registrations = 4096;               // buffers and events, each
  uint64_t max_session_bytes = uint64_t{1} << 40;  // bytes of windows per session
  bool allow_sessionless = false;  // buffers registered without a session (usable by anyone)
};

class BufferRegistry final {
 public:
  // `devices`: the served CUDA devices; `sessions` and `opener` outlive the registry.
  BufferRegistry(std::vector<int> devices, const SessionTable* sessions, IpcOpener* opener,
                 BufferRegistryLimits limits = {});
  // Closes every mapping; no lease may outlive the registry.
  ~BufferRegistry();

  // INVALID_ARGUMENT for bad handles, sizes, windows or devices, and for a missing session
  // (unless sessionless buffers are allowed); UNIMPLEMENTED for PyTorch expandable-segment
  // handles; NOT_FOUND for unknown sessions; RESOURCE_EXHAUSTED past the registration limit or
  // the session's byte limit.
  absl::StatusOr<RegisteredBuffer> Register(const BufferRegistration& request);
  // Returns true when deferred (requests still use it). NOT_FOUND when unknown or already closing;
  // PERMISSION_DENIED for a buffer of another session.
  absl::StatusOr<bool> Unregister(uint64_t buffer_id, uint64_t session_id);
  std::vector<BufferListing> List() const;

  absl::StatusOr<BufferLease> Acquire(uint64_t buffer_id, uint64_t offset_bytes,
                                      uint64_t extent_bytes, uint64_t session_id);

  // Releases every registration of the session (deferred where in use); called once the session
  // has closed.
  void CloseSession(uint64_t session_id);

  BufferCounters counters() const;
  // The same, of the buffers on `device`.
  BufferCounters counters(int device) const;

 private:
  struct Mapping {
    IpcHandleBytes handle;
    int device = 0;
    void* base = nullptr;
    uint64_t size = 0;
    int refs = 0;
  };
  struct Registration {
    std::string name;
    int device = 0;
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
  RegisteredBuffer AddLocked(const BufferRegistration& request, Mapping* mapping)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a registration; true when its mapping is now unused (call CloseUnused).
  bool RemoveLocked(uint64_t buffer_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes now, or marks for removal when in use (*deferred); true as RemoveLocked.
  bool UnregisterLocked(uint64_t buffer_id, bool* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes every mapping no registration uses.
  void CloseUnused() ABSL_LOCKS_EXCLUDED(mu_, open_mu_);

  // Bytes of windows `session_id` has registered.
  uint64_t SessionBytesLocked(uint64_t session_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<int> devices_;
  const SessionTable* const sessions_;
  IpcOpener* const opener_;
  const BufferRegistryLimits limits_;
  // Serialises opening and closing allocations (slow CUDA calls) without holding mu_, which the
  // request path takes.
  absl::Mutex open_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  uint64_t next_buffer_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Registration> registrations_ ABSL_GUARDED_BY(mu_);
  std::map<IpcHandleBytes, std::unique_ptr<Mapping>> mappings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace probesidecar::server
