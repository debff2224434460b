// The open sessions (OpenSession): the owners of registered buffers and events. A session's
// registrations are released when it closes (the registries' CloseSession), so that a client
// process that exits does not keep its memory pinned by our mappings.
#pragma once

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace probesidecar::server {

class SessionTable {
 public:
  // A new session of `client_pid`; ids start at 1 (0 means "no session").
  uint64_t Open(int64_t client_pid) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    sessions_[id] = client_pid;
    return id;
  }
  void Close(uint64_t id) {
    absl::MutexLock lock(&mu_);
    sessions_.erase(id);
  }
  // OK when session `id` is open; NOT_FOUND, naming it, when not (what a registration under it
  // answers).
  absl::Status RequireOpen(uint64_t id) const {
    absl::MutexLock lock(&mu_);
    if (sessions_.contains(id)) return absl::OkStatus();
    return absl::NotFoundError(absl::StrCat("session_id: session ", id, " is not open"));
  }
  uint64_t size() const {
    absl::MutexLock lock(&mu_);
    return sessions_.size();
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, int64_t> sessions_ ABSL_GUARDED_BY(mu_);  // id -> client pid
};

}  // namespace probesidecar::server
