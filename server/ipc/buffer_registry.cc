#include "server/ipc/buffer_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace probesidecar::server {

absl::StatusOr<int> ResolveDevice(const std::optional<int>& device, const std::vector<int>& devices,
                                  const char* what) {
  const std::string served = absl::StrJoin(devices, ", ");
  const char* plural = devices.size() == 1 ? "" : "s";
  if (!device.has_value()) {
    if (devices.size() == 1) return devices.front();
    return absl::InvalidArgumentError(absl::StrCat(
        "device_id: missing; this server serves CUDA devices ", served, ": say which device the ",
        what, " is on (the ordinal as the server numbers its devices)"));
  }
  if (std::find(devices.begin(), devices.end(), *device) == devices.end()) {
    return absl::InvalidArgumentError(absl::StrCat("device_id: this server serves CUDA device",
                                                   plural, " ", served, "; the ", what,
                                                   " is on device ", *device));
  }
  return *device;
}

BufferRegistry::BufferRegistry(std::vector<int> devices, const SessionTable* sessions,
                               IpcOpener* opener, BufferRegistryLimits limits)
    : devices_(std::move(devices)), sessions_(sessions), opener_(opener), limits_(limits) {}

uint64_t BufferRegistry::SessionBytesLocked(uint64_t session_id) const {
  uint64_t bytes = 0;
  for (const auto& [id, r] : registrations_) {
    if (r.session_id == session_id) bytes += r.size;
  }
  return bytes;
}

BufferRegistry::~BufferRegistry() {
  absl::MutexLock lock(&mu_);
  for (auto& [handle, mapping] : mappings_) opener_->Close(mapping->base, mapping->device);
  mappings_.clear();
  registrations_.clear();
}

absl::StatusOr<RegisteredBuffer> BufferRegistry::Register(const BufferRegistration& request) {
  absl::StatusOr<IpcHandleBytes> handle = ParseIpcHandle(request.handle);
  if (!handle.ok()) return handle.status();
  absl::StatusOr<int> device = ResolveDevice(request.device, devices_, "buffer");
  if (!device.ok()) return device.status();
  if (request.byte_size == 0) {
    return absl::InvalidArgumentError("byte_size: must be positive");
  }
  uint64_t window_end = 0;
  if (__builtin_add_overflow(request.offset_bytes, request.byte_size, &window_end)) {
    return absl::InvalidArgumentError("offset_bytes + byte_size overflows");
  }
  auto check_window = [&](uint64_t allocation_bytes) -> absl::Status {
    if (window_end <= allocation_bytes) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("offset_bytes + byte_size = ", window_end,
                                                   " is past the end of the allocation (",
                                                   allocation_bytes, " bytes)"));
  };
  if (request.session_id == 0 && !limits_.allow_sessionless) {
    return absl::InvalidArgumentError(
        "session_id: missing; a buffer belongs to the session (OpenSession) that registers it, "
        "so that no other client can use it (--allow-sessionless-buffers accepts buffers "
        "without one)");
  }
  auto check_session = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (request.session_id != 0) {
      if (absl::Status open = sessions_->RequireOpen(request.session_id); !open.ok()) return open;
    }
    const uint64_t held = SessionBytesLocked(request.session_id);
    if (held + request.byte_size > limits_.max_session_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("session ", request.session_id, " has ", held, " bytes registered; ",
                       request.byte_size, " more is over the limit of ", limits_.max_session_bytes,
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
      if (it->second->device != *device) {
        return absl::InvalidArgumentError(
            absl::StrCat("device_id: the allocation is on device ", it->second->device,
                         " (registered there before), not device ", *device));
      }
      if (absl::Status s = check_window(it->second->size); !s.ok()) return s;
      return AddLocked(request, it->second.get());
    }
  }
  // Opening takes 60-150 µs: done without mu_, so requests go on meanwhile.
  absl::StatusOr<IpcOpener::Mapping> opened = opener_->Open(*handle, *device);
  if (!opened.ok()) return opened.status();
  if (absl::Status s = check_window(opened->size); !s.ok()) {
    opener_->Close(opened->base, *device);
    return s;
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = check_session(); !s.ok()) {  // the session ended meanwhile
    opener_->Close(opened->base, *device);
    return s;
  }
  auto mapping = std::make_unique<Mapping>();
  mapping->handle = *handle;
  mapping->device = *device;
  mapping->base = opened->base;
  mapping->size = opened->size;
  Mapping* raw = mapping.get();
  mappings_.emplace(*handle, std::move(mapping));
  return AddLocked(request, raw);
}

RegisteredBuffer BufferRegistry::AddLocked(const BufferRegistration& request, Mapping* mapping) {
  const bool shared = mapping->refs > 0;
  ++mapping->refs;
  const uint64_t id = next_buffer_id_++;
  Registration& r = registrations_[id];
  r.name = request.name;
  r.device = mapping->device;
  r.client_pid = request.client_pid;
  r.session_id = request.session_id;
  r.offset = request.offset_bytes;
  r.size = request.byte_size;
  r.mapping = mapping;
  RegisteredBuffer registered;
  registered.buffer_id = id;
  registered.allocation_bytes = mapping->size;
  registered.shared_mapping = shared;
  registered.device = mapping->device;
  return registered;
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
  for (const std::unique_ptr<Mapping>& mapping : unused) {
    opener_->Close(mapping->base, mapping->device);
  }
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

std::vector<BufferListing> BufferRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<BufferListing> out;
  for (const auto& [id, r] : registrations_) {
    BufferListing& info = out.emplace_back();
    info.buffer_id = id;
    info.name = r.name;
    info.device = r.device;
    info.offset_bytes = r.offset;
    info.byte_size = r.size;
    info.allocation_bytes = r.mapping->size;
    info.client_pid = r.client_pid;
    info.session_id = r.session_id;
    info.in_flight = r.in_flight;
    info.closing = r.closing;
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
  lease.device = r.device;
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

void BufferRegistry::CloseSession(uint64_t session_id) {
  bool close = false;
  {
    absl::MutexLock lock(&mu_);
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
  return c;
}

BufferCounters BufferRegistry::counters(int device) const {
  absl::MutexLock lock(&mu_);
  BufferCounters c;
  for (const auto& [id, r] : registrations_) {
    if (r.device != device) continue;
    ++c.registrations;
    c.registered_bytes += r.size;
  }
  for (const auto& [handle, mapping] : mappings_) {
    c.open_handles += mapping->device == device && mapping->refs > 0 ? 1 : 0;
  }
  return c;
}

}  // namespace probesidecar::server
