// Fuzz target: buffer and event registration (RegisterBuffer, UnregisterBuffer, RegisterEvent,
// UnregisterEvent, sessions) and the leases requests take, as a sequence of operations decoded
// from the input.
//
// The allocations are host memory of exactly their size (FakeIpcOpener), so AddressSanitizer
// catches a lease outside its allocation; the opener traps on a second close. Properties: a lease
// lies inside its registered window and goes only to the session that registered the buffer (as
// does an unregistration), a session's windows stay within its byte limit, sessionless buffers
// only where allowed, the registry's counters match what it lists and what the opener holds open,
// a refusal is a clean message, and when the registry is destroyed (after every lease ends)
// nothing stays open.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/ipc/ipc_registries.h"
#include "tests/fuzz/fake_ipc_opener.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/message_check.h"

namespace {

using probesidecar::server::BufferLease;
using probesidecar::server::EventLease;
using probesidecar::server::IpcRegistries;

enum class Op : uint8_t {
  kRegister,
  kUnregister,
  kAcquire,
  kEndLease,
  kOpenSession,
  kCloseSession,
  kRegisterEvent,
  kUnregisterEvent,
  kAcquireEvent,
  kList,
  kMaxValue = kList,
};

// Allocation sizes from the handle's second byte: 1 to 8 KiB, some odd.
uint64_t AllocationBytes(const probesidecar::server::IpcHandleBytes& handle) {
  return 1 + static_cast<uint8_t>(handle[1]) * 32;
}

// A value that is often small, sometimes one of the registry's own ids, sometimes anything.
uint64_t PickId(FuzzedDataProvider& in, const std::vector<uint64_t>& known) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
    case 1:
      if (!known.empty()) return known[in.ConsumeIntegralInRange<size_t>(0, known.size() - 1)];
      return 1;
    case 2:
      return in.ConsumeIntegralInRange<uint64_t>(0, 8);
    default:
      return in.ConsumeIntegral<uint64_t>();
  }
}

// The device a registration names: none, the served device 0, or anything.
std::optional<int> PickDevice(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      return std::nullopt;
    case 1:
      return 0;
    default:
      return in.ConsumeIntegral<int32_t>();
  }
}

uint64_t PickBytes(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      return in.ConsumeIntegralInRange<uint64_t>(0, 9000);
    case 1:
      return uint64_t{1} << in.ConsumeIntegralInRange<int>(0, 63);
    default:
      return in.ConsumeIntegral<uint64_t>();
  }
}

std::string PickHandle(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: {  // a raw handle from a small set of allocations
      std::string h(64, 'h');
      h[0] = static_cast<char>('A' + in.ConsumeIntegralInRange<int>(0, 3));
      h[1] = static_cast<char>(in.ConsumeIntegral<uint8_t>());
      return h;
    }
    case 1: {  // PyTorch's versioned form of the same
      std::string h(66, 'h');
      h[0] = 2;
      h[1] = 'c';
      h[2] = static_cast<char>('A' + in.ConsumeIntegralInRange<int>(0, 3));
      h[3] = static_cast<char>(in.ConsumeIntegral<uint8_t>());
      return h;
    }
    default:
      return in.ConsumeRandomLengthString(80);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  probesidecar::fuzz::FakeIpcOpener opener(AllocationBytes);
  {
    probesidecar::server::BufferRegistryLimits limits;
    limits.max_registrations = 16;
    limits.max_session_bytes = uint64_t{1} << in.ConsumeIntegralInRange<int>(6, 40);
    limits.allow_sessionless = in.ConsumeBool();
    probesidecar::server::SessionTable session_table;
    auto ipc =
        std::make_unique<IpcRegistries>(std::vector<int>{0}, &session_table, &opener, limits);
    std::vector<uint64_t> buffers, sessions, events;
    struct Held {
      uint64_t buffer_id;
      BufferLease lease;
    };
    std::vector<Held> leases;
    std::vector<EventLease> event_leases;
    struct Window {
      uint64_t offset, size, session;
    };
    std::map<uint64_t, Window> windows;  // by buffer id

    for (int step = 0; step < 64 && in.remaining_bytes() > 0; ++step) {
      switch (in.ConsumeEnum<Op>()) {
        case Op::kRegister: {
          probesidecar::server::BufferRegistration r;
          r.handle = PickHandle(in);
          r.device = PickDevice(in);
          r.offset_bytes = PickBytes(in);
          r.byte_size = PickBytes(in);
          r.session_id = in.ConsumeBool() ? 0 : PickId(in, sessions);
          r.name = in.ConsumeRandomLengthString(16);
          absl::StatusOr<probesidecar::server::RegisteredBuffer> response =
              ipc->buffers.Register(r);
          if (!response.ok()) {
            probesidecar::fuzz::CheckRefusalMessage(response.status());
            break;
          }
          FUZZ_CHECK(r.offset_bytes + r.byte_size <= response->allocation_bytes);
          FUZZ_CHECK(r.byte_size > 0);
          FUZZ_CHECK(r.session_id != 0 || limits.allow_sessionless);
          FUZZ_CHECK(response->device == 0);
          buffers.push_back(response->buffer_id);
          windows[response->buffer_id] = {r.offset_bytes, r.byte_size, r.session_id};
          break;
        }
        case Op::kUnregister: {
          const uint64_t id = PickId(in, buffers);
          const uint64_t session = in.ConsumeBool() ? 0 : PickId(in, sessions);
          absl::StatusOr<bool> deferred = ipc->buffers.Unregister(id, session);
          FUZZ_CHECK(!deferred.ok() || windows[id].session == session);
          if (!deferred.ok()) probesidecar::fuzz::CheckRefusalMessage(deferred.status());
          break;
        }
        case Op::kAcquire: {
          const uint64_t id = PickId(in, buffers);
          const uint64_t offset = PickBytes(in);
          const uint64_t extent = PickBytes(in);
          const uint64_t session = in.ConsumeBool() ? 0 : PickId(in, sessions);
          absl::StatusOr<BufferLease> lease = ipc->buffers.Acquire(id, offset, extent, session);
          if (!lease.ok()) {
            probesidecar::fuzz::CheckRefusalMessage(lease.status());
            break;
          }
          FUZZ_CHECK(windows.contains(id));
          FUZZ_CHECK(windows[id].session == session);  // only its own session uses a buffer
          FUZZ_CHECK(offset + extent <= windows[id].size);
          // Every byte of the leased window is inside the allocation.
          char* p = static_cast<char*>(lease->device_ptr);
          if (extent > 0) {
            std::memset(p, 0x11, 1);
            std::memset(p + extent - 1, 0x22, 1);
          }
          leases.push_back({id, *std::move(lease)});
          break;
        }
        case Op::kEndLease:
          if (!leases.empty()) {
            leases.erase(leases.begin() + in.ConsumeIntegralInRange<size_t>(0, leases.size() - 1));
          } else if (!event_leases.empty()) {
            event_leases.pop_back();
          }
          break;
        case Op::kOpenSession:
          sessions.push_back(ipc->sessions.Open(in.ConsumeIntegral<int64_t>()));
          break;
        case Op::kCloseSession:
          ipc->CloseSession(PickId(in, sessions));
          break;
        case Op::kRegisterEvent: {
          probesidecar::server::EventRegistration r;
          r.handle = in.ConsumeBool() ? std::string(64, 'e') : PickHandle(in);
          r.device = PickDevice(in);
          r.session_id = PickId(in, sessions);
          absl::StatusOr<uint64_t> id = ipc->events.Register(r);
          if (!id.ok()) {
            probesidecar::fuzz::CheckRefusalMessage(id.status());
            break;
          }
          events.push_back(*id);
          break;
        }
        case Op::kUnregisterEvent: {
          absl::Status s = ipc->events.Unregister(PickId(in, events), PickId(in, sessions));
          if (!s.ok()) probesidecar::fuzz::CheckRefusalMessage(s);
          break;
        }
        case Op::kAcquireEvent: {
          absl::StatusOr<EventLease> lease =
              ipc->events.Acquire(PickId(in, events), PickId(in, sessions));
          if (!lease.ok()) {
            probesidecar::fuzz::CheckRefusalMessage(lease.status());
            break;
          }
          FUZZ_CHECK(lease->event != nullptr);
          event_leases.push_back(*std::move(lease));
          break;
        }
        case Op::kList:
          break;
      }
      // After every operation: the counters agree with the listing and with the opener.
      const probesidecar::server::BufferCounters counters = ipc->buffers.counters();
      const std::vector<probesidecar::server::BufferListing> list = ipc->buffers.List();
      FUZZ_CHECK(counters.registrations == list.size());
      uint64_t bytes = 0;
      uint64_t in_flight = 0;
      std::map<uint64_t, uint64_t> session_bytes;
      for (const probesidecar::server::BufferListing& info : list) {
        bytes += info.byte_size;
        if (info.session_id != 0 && !info.closing) {
          session_bytes[info.session_id] += info.byte_size;
          FUZZ_CHECK(session_bytes[info.session_id] <= limits.max_session_bytes);
        }
        in_flight += info.in_flight;
        FUZZ_CHECK(info.offset_bytes + info.byte_size <= info.allocation_bytes);
        FUZZ_CHECK(info.closing ? info.in_flight > 0 : true);
      }
      FUZZ_CHECK(counters.registered_bytes == bytes);
      FUZZ_CHECK(in_flight == leases.size());
      FUZZ_CHECK(counters.open_handles == opener.open_allocations());
      FUZZ_CHECK(counters.registrations <= 16);
    }
    // Requests end, then the server: nothing stays open.
    leases.clear();
    event_leases.clear();
    for (const probesidecar::server::BufferListing& info : ipc->buffers.List()) {
      FUZZ_CHECK(!info.closing);
    }
    ipc.reset();
  }
  FUZZ_CHECK(opener.open_allocations() == 0);
  FUZZ_CHECK(opener.open_events() == 0);
  return 0;
}
