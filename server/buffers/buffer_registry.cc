#include "server/buffers/buffer_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace probesidecar::server {

BufferRegistry::BufferRegistry(int device, IpcOpener* opener, BufferRegistryLimits limits)
    : device_(device), opener_(opener), limits_(limits) {}

uint64_t BufferRegistry::SessionBytesLocked(uint64_t session_id) const {
  uint64_t bytes = 0;
  for (const auto& [id, r] : registrations_) {
    if (r.session_id == session_id) bytes += r.size;
  }
  return bytes;
}

BufferRegistry::~BufferRegistry() {
  absl::MutexLock lock(&mu_);
  events_.clear();  // each closes once no request holds it (none may outlive the registry)
  for (auto& [handle, mapping] : mappings_) opener_->Close(mapping->base);
  mappings_.clear();
  registrations_.clear();
}

absl::StatusOr<v1::RegisterBufferResponse> BufferRegistry::Register(
    const v1::RegisterBufferRequest& request) {
  absl::StatusOr<IpcHandleBytes> handle = ParseIpcHandle(request.handle());
  if (!handle.ok()) return handle.status();
  if (request.device_id() != device_) {
    return absl::InvalidArgumentError(absl::StrCat("device_id: this server serves CUDA device ",
                                                   device_, "; the buffer is on device ",
                                                   request.device_id()));
  }
  if (request.byte_size() == 0) {
    return absl::InvalidArgumentError("byte_size: must be positive");
  }
  uint64_t window_end = 0;
  if (__builtin_add_overflow(request.offset_bytes(), request.byte_size(), &window_end)) {
    return absl::InvalidArgumentError("offset_bytes + byte_size overflows");
  }
  auto check_window = [&](uint64_t allocation_bytes) -> absl::Status {
    if (window_end <= allocation_bytes) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("offset_bytes + byte_size = ", window_end,
                                                   " is past the end of the allocation (",
                                                   allocation_bytes, " bytes)"));
  };
  if (request.session_id() == 0 && !limits_.allow_sessionless) {
    return absl::InvalidArgumentError(
        "session_id: missing; a buffer belongs to the session (OpenSession) that registers it, "
        "so that no other client can use it (--allow-sessionless-buffers accepts buffers "
        "without one)");
  }
  auto check_session = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (request.session_id() != 0 && !sessions_.contains(request.session_id())) {
      return absl::NotFoundError(
          absl::StrCat("session_id: session ", request.session_id(), " is not open"));
    }
    const uint64_t held = SessionBytesLocked(request.session_id());
    if (held + request.byte_size() > limits_.max_session_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session ", request.session_id(), " has ", held, " bytes registered; ",
          request.byte_size(), " more is over the limit of ", limits_.max_session_bytes,
          " bytes per session (--max-session-buffer-bytes)"));
    }
    return absl::OkStatus();
  };

  // open_mu_ keeps opens and closes of allocations in one order: a handle is never opened
  // while an earlier mapping of it waits to be closed.
  absl::MutexLock open_lock(&open_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = check_session(); !s.ok()) return s;
    if (registrations_.size() >= limits_.max_registrations) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this server already holds ", registrations_.size(), " registrations (the limit)"));
    }
    if (auto it = mappings_.find(*handle); it != mappings_.end()) {
      if (absl::Status s = check_window(it->second->size); !s.ok()) return s;
      return AddLocked(request, it->second.get());
    }
  }
  // Opening takes 60-150 µs: done without mu_, so requests go on meanwhile.
  absl::StatusOr<IpcOpener::Mapping> opened = opener_->Open(*handle);
  if (!opened.ok()) return opened.status();
  if (absl::Status s = check_window(opened->size); !s.ok()) {
    opener_->Close(opened->base);
    return s;
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = check_session(); !s.ok()) {  // the session ended meanwhile
    opener_->Close(opened->base);
    return s;
  }
  auto mapping = std::make_unique<Mapping>();
  mapping->handle = *handle;
  mapping->base = opened->base;
  mapping->size = opened->size;
  Mapping* raw = mapping.get();
  mappings_.emplace(*handle, std::move(mapping));
  return AddLocked(request, raw);
}

v1::RegisterBufferResponse BufferRegistry::AddLocked(const v1::RegisterBufferRequest& request,
                                                     Mapping* mapping) {
  const bool shared = mapping->refs > 0;
  ++mapping->refs;
  const uint64_t id = next_buffer_id_++;
  Registration& r = registrations_[id];
  r.name = request.name();
  r.client_pid = request.client_pid();
  r.session_id = request.session_id();
  r.offset = request.offset_bytes();
  r.size = request.byte_size();
  r.mapping = mapping;
  v1::RegisterBufferResponse response;
  response.set_buffer_id(id);
  response.set_allocation_bytes(mapping->size);
  response.set_shared_mapping(shared);
  return response;
}

bool BufferRegistry::RemoveLocked(uint64_t buffer_id) {
  auto it = registrations_.find(buffer_id);
  Mapping* mapping = it->second.mapping;
  registrations_.erase(it);
  // At zero the mapping stays listed until CloseUnused closes it (a new registration of the
  // same allocation may take it up again first).
  return --mapping->refs == 0;
}

bool BufferRegistry::UnregisterLocked(uint64_t buffer_id, bool* deferred) {
  Registration& r = registrations_.at(buffer_id);
  if (r.in_flight > 0) {
    r.closing = true;
    *deferred = true;
    return false;
  }
  *deferred = false;
  return RemoveLocked(buffer_id);
}

void BufferRegistry::CloseUnused() {
  absl::MutexLock open_lock(&open_mu_);
  std::vector<std::unique_ptr<Mapping>> unused;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = mappings_.begin(); it != mappings_.end();) {
      if (it->second->refs == 0) {
        unused.push_back(std::move(it->second));
        it = mappings_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const std::unique_ptr<Mapping>& mapping : unused) opener_->Close(mapping->base);
}

absl::StatusOr<bool> BufferRegistry::Unregister(uint64_t buffer_id, uint64_t session_id) {
  bool deferred = false;
  bool close = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = registrations_.find(buffer_id);
    if (it == registrations_.end() || it->second.closing) {
      return absl::NotFoundError(absl::StrCat("buffer ", buffer_id, " is not registered"));
    }
    if (it->second.session_id != session_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("buffer ", buffer_id, " belongs to another session"));
    }
    close = UnregisterLocked(buffer_id, &deferred);
  }
  if (close) CloseUnused();
  return deferred;
}

std::vector<v1::BufferInfo> BufferRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::BufferInfo> out;
  for (const auto& [id, r] : registrations_) {
    v1::BufferInfo& info = out.emplace_back();
    info.set_buffer_id(id);
    info.set_name(r.name);
    info.set_device_id(device_);
    info.set_offset_bytes(r.offset);
    info.set_byte_size(r.size);
    info.set_allocation_bytes(r.mapping->size);
    info.set_client_pid(r.client_pid);
    info.set_session_id(r.session_id);
    info.set_in_flight(r.in_flight);
    info.set_closing(r.closing);
  }
  return out;
}

absl::StatusOr<BufferLease> BufferRegistry::Acquire(uint64_t buffer_id, uint64_t offset_bytes,
                                                    uint64_t extent_bytes, uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = registrations_.find(buffer_id);
  if (it == registrations_.end() || it->second.closing) {
    return absl::NotFoundError(absl::StrCat("buffer ", buffer_id, " is not registered"));
  }
  Registration& r = it->second;
  if (r.session_id != session_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "buffer ", buffer_id, " belongs to another session (the request names session ", session_id,
        "; set session_id to the session that registered it)"));
  }
  uint64_t end = 0;
  if (__builtin_add_overflow(offset_bytes, extent_bytes, &end) || end > r.size) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset_bytes, " + ", extent_bytes,
                                                   " bytes is past the end of buffer ", buffer_id,
                                                   " (", r.size, " bytes registered)"));
  }
  ++r.in_flight;
  BufferLease lease;
  lease.device = device_;
  lease.device_ptr = static_cast<char*>(r.mapping->base) + r.offset + offset_bytes;
  // The deleter runs when the request's last copy of the lease goes away.
  lease.hold =
      std::shared_ptr<void>(this, [buffer_id](BufferRegistry* self) { self->Release(buffer_id); });
  return lease;
}

void BufferRegistry::Release(uint64_t buffer_id) {
  bool close = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = registrations_.find(buffer_id);
    if (it == registrations_.end()) return;
    if (--it->second.in_flight == 0 && it->second.closing) close = RemoveLocked(buffer_id);
  }
  if (close) CloseUnused();
}

uint64_t BufferRegistry::OpenSession(int64_t client_pid) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_session_id_++;
  sessions_[id] = client_pid;
  return id;
}

absl::StatusOr<uint64_t> BufferRegistry::RegisterEvent(const v1::RegisterEventRequest& request) {
  absl::StatusOr<IpcHandleBytes> parsed = ParseIpcEventHandle(request.handle());
  if (!parsed.ok()) return parsed.status();
  if (request.device_id() != device_) {
    return absl::InvalidArgumentError(absl::StrCat("device_id: this server serves CUDA device ",
                                                   device_, "; the event is on device ",
                                                   request.device_id()));
  }
  const IpcHandleBytes handle = *parsed;
  auto check = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (request.session_id() == 0) {
      return absl::InvalidArgumentError(
          "session_id: events belong to a session; open one with OpenSession");
    }
    if (!sessions_.contains(request.session_id())) {
      return absl::NotFoundError(
          absl::StrCat("session_id: session ", request.session_id(), " is not open"));
    }
    if (events_.size() >= limits_.max_registrations) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this server already holds ", events_.size(), " events (the limit)"));
    }
    return absl::OkStatus();
  };
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = check(); !s.ok()) return s;
  }
  absl::StatusOr<void*> opened = opener_->OpenEvent(handle);
  if (!opened.ok()) return opened.status();
  IpcOpener* opener = opener_;
  auto event = std::shared_ptr<Event>(new Event{*opened, request.session_id()}, [opener](Event* e) {
    opener->CloseEvent(e->event);
    delete e;
  });
  absl::MutexLock lock(&mu_);
  if (absl::Status s = check(); !s.ok()) return s;  // (the event closes with `event`)
  const uint64_t id = next_event_id_++;
  events_.emplace(id, std::move(event));
  return id;
}

absl::Status BufferRegistry::UnregisterEvent(uint64_t event_id, uint64_t session_id) {
  std::shared_ptr<Event> released;  // closed outside the lock, unless a request holds it
  absl::MutexLock lock(&mu_);
  absl::StatusOr<EventMap::iterator> it = FindEvent(event_id, session_id);
  if (!it.ok()) return it.status();
  released = std::move((*it)->second);
  events_.erase(*it);
  return absl::OkStatus();
}

absl::StatusOr<EventLease> BufferRegistry::AcquireEvent(uint64_t event_id, uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<EventMap::iterator> it = FindEvent(event_id, session_id);
  if (!it.ok()) return it.status();
  EventLease lease;
  lease.event = (*it)->second->event;
  lease.hold = (*it)->second;
  return lease;
}

absl::StatusOr<BufferRegistry::EventMap::iterator> BufferRegistry::FindEvent(uint64_t event_id,
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

void BufferRegistry::CloseSession(uint64_t session_id) {
  bool close = false;
  std::vector<std::shared_ptr<Event>> released;  // closed outside the lock
  {
    absl::MutexLock lock(&mu_);
    sessions_.erase(session_id);
    for (auto it = events_.begin(); it != events_.end();) {
      if (it->second->session_id == session_id) {
        released.push_back(std::move(it->second));
        it = events_.erase(it);
      } else {
        ++it;
      }
    }
    std::vector<uint64_t> ids;
    for (const auto& [id, r] : registrations_) {
      if (r.session_id == session_id && !r.closing) ids.push_back(id);
    }
    for (uint64_t id : ids) {
      bool deferred = false;
      close |= UnregisterLocked(id, &deferred);
    }
  }
  if (close) CloseUnused();
}

BufferCounters BufferRegistry::counters() const {
  absl::MutexLock lock(&mu_);
  BufferCounters c;
  c.registrations = registrations_.size();
  for (const auto& [id, r] : registrations_) c.registered_bytes += r.size;
  for (const auto& [handle, mapping] : mappings_) c.open_handles += mapping->refs > 0 ? 1 : 0;
  c.sessions = sessions_.size();
  c.events = events_.size();
  return c;
}

}  // namespace probesidecar::server
