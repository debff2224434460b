#include "server/ipc/event_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/ipc/buffer_registry.h"
#include "server/ipc/ipc_handle.h"

namespace probesidecar::server {

EventRegistry::EventRegistry(std::vector<int> devices, const SessionTable* sessions,
                             IpcOpener* opener, uint32_t max_events)
    : devices_(std::move(devices)), sessions_(sessions), opener_(opener), max_events_(max_events) {}

EventRegistry::~EventRegistry() {
  absl::MutexLock lock(&mu_);
  events_.clear();  // each closes once no request holds it (none may outlive the registry)
}

absl::StatusOr<uint64_t> EventRegistry::Register(const EventRegistration& request) {
  absl::StatusOr<IpcHandleBytes> parsed = ParseIpcEventHandle(request.handle);
  if (!parsed.ok()) return parsed.status();
  absl::StatusOr<int> device = ResolveDevice(request.device, devices_, "event");
  if (!device.ok()) return device.status();
  auto check = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (request.session_id == 0) {
      return absl::InvalidArgumentError(
          "session_id: events belong to a session; open one with OpenSession");
    }
    if (absl::Status open = sessions_->RequireOpen(request.session_id); !open.ok()) return open;
    if (events_.size() >= max_events_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this server already holds ", events_.size(), " events (the limit)"));
    }
    return absl::OkStatus();
  };
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = check(); !s.ok()) return s;
  }
  absl::StatusOr<void*> opened = opener_->OpenEvent(*parsed, *device);
  if (!opened.ok()) return opened.status();
  IpcOpener* opener = opener_;
  auto event =
      std::shared_ptr<Event>(new Event{*opened, request.session_id, *device}, [opener](Event* e) {
        opener->CloseEvent(e->event, e->device);
        delete e;
      });
  absl::MutexLock lock(&mu_);
  if (absl::Status s = check(); !s.ok()) return s;  // (the event closes with `event`)
  const uint64_t id = next_event_id_++;
  events_.emplace(id, std::move(event));
  return id;
}

absl::Status EventRegistry::Unregister(uint64_t event_id, uint64_t session_id) {
  std::shared_ptr<Event> released;  // closed outside the lock, unless a request holds it
  absl::MutexLock lock(&mu_);
  absl::StatusOr<EventMap::iterator> it = FindLocked(event_id, session_id);
  if (!it.ok()) return it.status();
  released = std::move((*it)->second);
  events_.erase(*it);
  return absl::OkStatus();
}

absl::StatusOr<EventLease> EventRegistry::Acquire(uint64_t event_id, uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<EventMap::iterator> it = FindLocked(event_id, session_id);
  if (!it.ok()) return it.status();
  EventLease lease;
  lease.event = (*it)->second->event;
  lease.device = (*it)->second->device;
  lease.hold = (*it)->second;
  return lease;
}

absl::StatusOr<EventRegistry::EventMap::iterator> EventRegistry::FindLocked(uint64_t event_id,
                                                                            uint64_t session_id) {
  auto it = events_.find(event_id);
  if (it == events_.end()) {
    return absl::NotFoundError(absl::StrCat("event ", event_id, " is not registered"));
  }
  if (it->second->session_id != session_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("event ", event_id, " belongs to another session (the request names session ",
                     session_id, ")"));
  }
  return it;
}

void EventRegistry::CloseSession(uint64_t session_id) {
  std::vector<std::shared_ptr<Event>> released;  // closed outside the lock
  absl::MutexLock lock(&mu_);
  for (auto it = events_.begin(); it != events_.end();) {
    if (it->second->session_id == session_id) {
      released.push_back(std::move(it->second));
      it = events_.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t EventRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return events_.size();
}

uint64_t EventRegistry::size(int device) const {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [id, e] : events_) n += e->device == device ? 1 : 0;
  return n;
}

}  // namespace probesidecar::server
