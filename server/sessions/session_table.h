// The open sessions (OpenSession): the owners of registered buffers and events, and the label
// slot (observability/outcome_labels.h) whose series count the outcomes of their requests. A
// session's registrations are released when it closes (the registries' CloseSession), so that a
// client process that exits does not keep its memory pinned by our mappings. Sessions exist on
// every backend (on the CPU backend they only carry labels).
#pragma once

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace probesidecar::server {

class SessionTable {
 public:
  // A new session of `client_pid` whose requests count their outcomes in `outcome_slot`; ids
  // start at 1 (0 means "no session").
  uint64_t Open(int64_t client_pid, int outcome_slot = 0) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    sessions_[id] = Session{client_pid, outcome_slot};
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
    return NotOpen(id);
  }
  // The outcome slot of a request naming session `id`: 0 (unlabelled) for id 0, NOT_FOUND when
  // session `id` is not open.
  absl::StatusOr<int> OutcomeSlot(uint64_t id) const {
    if (id == 0) return 0;
    absl::MutexLock lock(&mu_);
    const auto it = sessions_.find(id);
    if (it == sessions_.end()) return NotOpen(id);
    return it->second.outcome_slot;
  }
  uint64_t size() const {
    absl::MutexLock lock(&mu_);
    return sessions_.size();
  }

 private:
  struct Session {
    int64_t client_pid = 0;
    int outcome_slot = 0;
  };
  static absl::Status NotOpen(uint64_t id) {
    return absl::NotFoundError(absl::StrCat("session_id: session ", id, " is not open"));
  }

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace probesidecar::server
