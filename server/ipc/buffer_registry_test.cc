#include "server/ipc/buffer_registry.h"

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/ipc/event_registry.h"

namespace probesidecar::server {
namespace {

// Stands in for CUDA: each distinct handle is an "allocation" of a fixed size; it fails the way
// cudaIpcOpenMemHandle does when a handle is opened twice without a close in between.
class FakeOpener final : public IpcOpener {
 public:
  absl::StatusOr<Mapping> Open(const IpcHandleBytes& handle, int /*device*/) override {
    const std::string key(handle.data(), handle.size());
    if (open_.count(key)) return absl::InternalError("already mapped (opened twice)");
    if (key[1] == 'X') return absl::InvalidArgumentError("handle: cannot open");
    ++opens;
    Mapping m;
    m.base = reinterpret_cast<void*>(0x100000 * (opens + 1));
    m.size = kAllocationBytes;
    open_[key] = m.base;
    return m;
  }
  void Close(void* base, int /*device*/) override {
    for (auto it = open_.begin(); it != open_.end(); ++it) {
      if (it->second == base) {
        open_.erase(it);
        ++closes;
        return;
      }
    }
    ADD_FAILURE() << "closing an allocation that is not open";
  }
  size_t open_count() const { return open_.size(); }
  absl::StatusOr<void*> OpenEvent(const IpcHandleBytes& handle, int /*device*/) override {
    if (handle[0] == 'X') return absl::InvalidArgumentError("handle: cannot open event");
    ++event_opens;
    return reinterpret_cast<void*>(0x7000 + event_opens);
  }
  void CloseEvent(void* event, int /*device*/) override {
    ++event_closes;
    closed_events.push_back(event);
  }
  int event_opens = 0;
  int event_closes = 0;
  std::vector<void*> closed_events;

  static constexpr uint64_t kAllocationBytes = 1 << 20;
  int opens = 0;
  int closes = 0;

 private:
  std::map<std::string, void*> open_;
};

std::string Handle(char id) {
  std::string h(64, 'h');
  h[0] = id;
  return h;
}

BufferRegistration Request(char id, uint64_t offset, uint64_t size, uint64_t session = 0) {
  BufferRegistration r;
  r.name = std::string("buf-") + id;
  r.handle = Handle(id);
  r.offset_bytes = offset;
  r.byte_size = size;
  r.client_pid = 4242;
  r.session_id = session;
  return r;
}

class BufferRegistryTest : public ::testing::Test {
 protected:
  // Ends a session as the service does: the table first, then what it registered.
  void CloseSession(uint64_t session) {
    sessions_.Close(session);
    registry_.CloseSession(session);
    events_.CloseSession(session);
  }

  FakeOpener opener_;
  SessionTable sessions_;
  // Sessionless buffers allowed here, so that most tests need no session (session 0).
  BufferRegistry registry_{
      {0}, &sessions_, &opener_, BufferRegistryLimits{8, uint64_t{1} << 40, true}};
  EventRegistry events_{{0}, &sessions_, &opener_, 8};
};

TEST_F(BufferRegistryTest, RegistrationsOfOneAllocationShareOneMapping) {
  auto a = registry_.Register(Request('a', 0, 4096));
  auto b = registry_.Register(Request('a', 8192, 4096));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_FALSE(a->shared_mapping);
  EXPECT_TRUE(b->shared_mapping);
  EXPECT_NE(a->buffer_id, b->buffer_id);
  EXPECT_EQ(a->allocation_bytes, FakeOpener::kAllocationBytes);
  EXPECT_EQ(opener_.opens, 1);
  EXPECT_EQ(registry_.counters().open_handles, 1u);
  EXPECT_EQ(registry_.counters().registrations, 2u);
  EXPECT_EQ(registry_.counters().registered_bytes, 8192u);

  // Each window maps at its own offset.
  auto la = registry_.Acquire(a->buffer_id, 16, 32, 0);
  auto lb = registry_.Acquire(b->buffer_id, 16, 32, 0);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(static_cast<char*>(lb->device_ptr) - static_cast<char*>(la->device_ptr), 8192);

  absl::StatusOr<bool> deferred = registry_.Unregister(a->buffer_id, 0);
  ASSERT_TRUE(deferred.ok());
  EXPECT_TRUE(*deferred);  // la is in flight
  la->hold.reset();
  lb->hold.reset();
  EXPECT_EQ(opener_.closes, 0);  // b still uses the mapping
  ASSERT_TRUE(registry_.Unregister(b->buffer_id, 0).ok());
  EXPECT_EQ(opener_.closes, 1);
  EXPECT_EQ(opener_.open_count(), 0u);
  // The allocation can be registered again: it is opened anew.
  ASSERT_TRUE(registry_.Register(Request('a', 0, 16)).ok());
  EXPECT_EQ(opener_.opens, 2);
}

TEST_F(BufferRegistryTest, UnregisterWhileInUseIsDeferredUntilTheLastLease) {
  auto a = registry_.Register(Request('a', 0, 4096));
  ASSERT_TRUE(a.ok());
  auto lease1 = registry_.Acquire(a->buffer_id, 0, 4096, 0);
  auto lease2 = registry_.Acquire(a->buffer_id, 100, 10, 0);
  ASSERT_TRUE(lease1.ok() && lease2.ok());
  absl::StatusOr<bool> deferred = registry_.Unregister(a->buffer_id, 0);
  ASSERT_TRUE(deferred.ok());
  EXPECT_TRUE(*deferred);
  // Closing: no new request can use it, a second unregister is NOT_FOUND, it is still listed.
  EXPECT_EQ(registry_.Acquire(a->buffer_id, 0, 1, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.Unregister(a->buffer_id, 0).status().code(), absl::StatusCode::kNotFound);
  std::vector<BufferListing> listed = registry_.List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].closing);
  EXPECT_EQ(listed[0].in_flight, 2u);
  lease1->hold.reset();
  EXPECT_EQ(opener_.closes, 0);
  lease2->hold.reset();
  EXPECT_EQ(opener_.closes, 1);
  EXPECT_TRUE(registry_.List().empty());
}

TEST_F(BufferRegistryTest, UnregisterWhenIdleClosesAtOnce) {
  auto a = registry_.Register(Request('a', 0, 64));
  ASSERT_TRUE(a.ok());
  absl::StatusOr<bool> deferred = registry_.Unregister(a->buffer_id, 0);
  ASSERT_TRUE(deferred.ok());
  EXPECT_FALSE(*deferred);
  EXPECT_EQ(opener_.closes, 1);
  EXPECT_EQ(registry_.Unregister(a->buffer_id, 0).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BufferRegistryTest, AcquireChecksTheWindowOverflowSafely) {
  auto a = registry_.Register(Request('a', 4096, 1000));
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(registry_.Acquire(a->buffer_id, 0, 1000, 0).ok());
  EXPECT_TRUE(registry_.Acquire(a->buffer_id, 999, 1, 0).ok());
  for (auto [offset, extent] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 1001}, {1000, 1}, {1, 1000}, {UINT64_MAX, 2}, {2, UINT64_MAX}}) {
    absl::StatusOr<BufferLease> lease = registry_.Acquire(a->buffer_id, offset, extent, 0);
    ASSERT_FALSE(lease.ok()) << offset << " " << extent;
    EXPECT_EQ(lease.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(lease.status().message().find("past the end"), absl::string_view::npos);
  }
  EXPECT_EQ(registry_.Acquire(999, 0, 1, 0).status().code(), absl::StatusCode::kNotFound);
  // Refused acquisitions took no lease: the buffer closes at once.
  EXPECT_FALSE(*registry_.Unregister(a->buffer_id, 0));
}

TEST_F(BufferRegistryTest, BadRegistrationsChangeNothing) {
  struct Case {
    BufferRegistration request;
    absl::StatusCode code;
    const char* fragment;
  };
  BufferRegistration other_device = Request('a', 0, 16);
  other_device.device = 1;
  BufferRegistration short_handle = Request('a', 0, 16);
  short_handle.handle = "abc";
  BufferRegistration unopenable = Request('a', 0, 16);
  unopenable.handle = std::string(1, 'z') + "X" + std::string(62, 'q');
  for (const Case& c : std::vector<Case>{
           {Request('a', 0, 0), absl::StatusCode::kInvalidArgument, "byte_size"},
           {Request('a', FakeOpener::kAllocationBytes, 1), absl::StatusCode::kInvalidArgument,
            "past the end of the allocation"},
           {Request('a', 1, FakeOpener::kAllocationBytes), absl::StatusCode::kInvalidArgument,
            "past the end of the allocation"},
           {Request('a', UINT64_MAX, 2), absl::StatusCode::kInvalidArgument, "overflows"},
           {other_device, absl::StatusCode::kInvalidArgument, "serves CUDA device 0"},
           {short_handle, absl::StatusCode::kInvalidArgument, "3 bytes"},
           {unopenable, absl::StatusCode::kInvalidArgument, "cannot open"},
           {Request('a', 0, 16, /*session=*/77), absl::StatusCode::kNotFound, "session 77"},
       }) {
    auto r = registry_.Register(c.request);
    ASSERT_FALSE(r.ok()) << c.fragment;
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_NE(r.status().message().find(c.fragment), absl::string_view::npos) << r.status();
  }
  EXPECT_TRUE(registry_.List().empty());
  EXPECT_EQ(opener_.open_count(), 0u);  // a window past the end closed what it opened
}

TEST_F(BufferRegistryTest, RegistrationLimit) {
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(registry_.Register(Request('a', i, 1)).ok());
  auto r = registry_.Register(Request('b', 0, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(opener_.opens, 1);
}

TEST_F(BufferRegistryTest, EndingASessionReleasesItsBuffers) {
  const uint64_t session = sessions_.Open(4242);
  const uint64_t other = sessions_.Open(777);
  auto a = registry_.Register(Request('a', 0, 64, session));
  auto b = registry_.Register(Request('b', 0, 64, session));
  auto c = registry_.Register(Request('c', 0, 64, other));
  auto d = registry_.Register(Request('d', 0, 64));  // no session: lives until unregistered
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  auto lease = registry_.Acquire(b->buffer_id, 0, 64, session);
  ASSERT_TRUE(lease.ok());
  CloseSession(session);
  EXPECT_EQ(registry_.Acquire(a->buffer_id, 0, 1, session).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(opener_.closes, 1);  // a closed; b waits for its request
  lease->hold.reset();
  EXPECT_EQ(opener_.closes, 2);
  EXPECT_EQ(registry_.List().size(), 2u);
  EXPECT_EQ(registry_.Register(Request('e', 0, 1, session)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(sessions_.size(), 1u);
}

TEST_F(BufferRegistryTest, ConcurrentLeasesAndUnregister) {
  auto a = registry_.Register(Request('a', 0, 4096));
  ASSERT_TRUE(a.ok());
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        absl::StatusOr<BufferLease> lease = registry_.Acquire(a->buffer_id, 0, 64, 0);
        if (lease.ok()) ++ok;
      }
    });
  }
  // Unregister while the threads are leasing (not before they started, on a loaded machine).
  while (ok.load() == 0) std::this_thread::yield();
  ASSERT_TRUE(registry_.Unregister(a->buffer_id, 0).ok());
  for (std::thread& t : threads) t.join();
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(opener_.closes, 1);
  EXPECT_TRUE(registry_.List().empty());
}

EventRegistration EventRequest(uint64_t session, char id = 'e') {
  EventRegistration r;
  r.handle = Handle(id);
  r.session_id = session;
  return r;
}

TEST_F(BufferRegistryTest, EventsBelongToTheirSessionAndCloseWithIt) {
  const uint64_t mine = sessions_.Open(1);
  const uint64_t theirs = sessions_.Open(2);
  absl::StatusOr<uint64_t> event = events_.Register(EventRequest(mine));
  ASSERT_TRUE(event.ok()) << event.status();
  absl::StatusOr<EventLease> lease = events_.Acquire(*event, mine);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_NE(lease->event, nullptr);
  // Another session may neither use nor unregister it; unknown ids are NOT_FOUND.
  EXPECT_EQ(events_.Acquire(*event, theirs).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(events_.Acquire(*event, 0).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(events_.Unregister(*event, theirs).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(events_.Acquire(*event + 100, mine).status().code(), absl::StatusCode::kNotFound);
  // The session ends while a request holds the event: it closes when the request lets go.
  CloseSession(mine);
  EXPECT_EQ(events_.Acquire(*event, mine).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(opener_.event_closes, 0);
  lease->hold.reset();
  EXPECT_EQ(opener_.event_closes, 1);
  EXPECT_EQ(events_.size(), 0u);
}

TEST_F(BufferRegistryTest, EventRegistrationIsValidated) {
  const uint64_t session = sessions_.Open(1);
  EventRegistration short_handle = EventRequest(session);
  short_handle.handle = "abc";
  EXPECT_EQ(events_.Register(short_handle).status().code(), absl::StatusCode::kInvalidArgument);
  EventRegistration zero_handle = EventRequest(session);
  zero_handle.handle = std::string(64, '\0');
  EXPECT_EQ(events_.Register(zero_handle).status().message(),
            "handle: all zero bytes; not a handle from cudaIpcGetEventHandle");
  EXPECT_EQ(events_.Register(EventRequest(0)).status().code(),
            absl::StatusCode::kInvalidArgument);  // no session
  EXPECT_EQ(events_.Register(EventRequest(session + 9)).status().code(),
            absl::StatusCode::kNotFound);  // not open
  EventRegistration other_device = EventRequest(session);
  other_device.device = 3;
  EXPECT_EQ(events_.Register(other_device).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(events_.Register(EventRequest(session, 'X')).status().code(),
            absl::StatusCode::kInvalidArgument);  // the opener refuses it
  EXPECT_EQ(opener_.event_opens, 0);
  EXPECT_EQ(events_.size(), 0u);
  absl::StatusOr<uint64_t> event = events_.Register(EventRequest(session));
  ASSERT_TRUE(event.ok());
  EXPECT_TRUE(events_.Unregister(*event, session).ok());
  EXPECT_EQ(opener_.event_closes, 1);
  EXPECT_EQ(events_.Unregister(*event, session).code(), absl::StatusCode::kNotFound);
}

TEST_F(BufferRegistryTest, ABufferIsUsableOnlyByItsSession) {
  const uint64_t mine = sessions_.Open(1);
  const uint64_t theirs = sessions_.Open(2);
  auto a = registry_.Register(Request('a', 0, 64, mine));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(registry_.Acquire(a->buffer_id, 0, 64, mine).ok());
  for (uint64_t other : {theirs, uint64_t{0}}) {
    EXPECT_EQ(registry_.Acquire(a->buffer_id, 0, 64, other).status().code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(registry_.Unregister(a->buffer_id, other).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(registry_.List().size(), 1u);  // still there
  EXPECT_TRUE(registry_.Unregister(a->buffer_id, mine).ok());
}

TEST(BufferRegistryLimitsTest, SessionlessBuffersAreRefusedByDefaultAndSessionsHaveAByteCap) {
  FakeOpener opener;
  SessionTable sessions;
  BufferRegistry registry({0}, &sessions, &opener, BufferRegistryLimits{8, 100, false});
  absl::StatusOr<RegisteredBuffer> none = registry.Register(Request('a', 0, 64));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("--allow-sessionless-buffers"), absl::string_view::npos);
  EXPECT_EQ(opener.opens, 0);
  const uint64_t session = sessions.Open(1);
  EXPECT_TRUE(registry.Register(Request('a', 0, 60, session)).ok());
  // 60 + 41 > 100: refused, whether the allocation is open already or not.
  EXPECT_EQ(registry.Register(Request('a', 0, 41, session)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(registry.Register(Request('b', 0, 41, session)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(registry.Register(Request('b', 0, 40, session)).ok());
  // Another session has its own budget.
  EXPECT_TRUE(registry.Register(Request('c', 0, 100, sessions.Open(2))).ok());
}

// A registry of several devices: each registration names its device (none is refused, as is one
// not served), its leases carry it, and the counters split by device. An allocation is on one
// device: registering it again for another is refused. Events likewise.
TEST(BufferRegistryDevicesTest, EachBufferAndEventIsOnTheDeviceItNames) {
  FakeOpener opener;
  SessionTable sessions;
  BufferRegistry registry({0, 2}, &sessions, &opener, BufferRegistryLimits{8, 1 << 20, true});
  EventRegistry events({0, 2}, &sessions, &opener, 8);
  BufferRegistration none = Request('a', 0, 64);
  absl::StatusOr<RegisteredBuffer> refused = registry.Register(none);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("device_id: missing; this server serves CUDA devices "
                                            "0, 2: say which device the buffer is on"),
            absl::string_view::npos)
      << refused.status();
  BufferRegistration on_1 = Request('a', 0, 64);
  on_1.device = 1;
  refused = registry.Register(on_1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("serves CUDA devices 0, 2; the buffer is on device 1"),
            absl::string_view::npos)
      << refused.status();
  EXPECT_EQ(opener.opens, 0);  // nothing was opened for a refusal

  BufferRegistration on_2 = Request('a', 0, 64);
  on_2.device = 2;
  absl::StatusOr<RegisteredBuffer> a = registry.Register(on_2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->device, 2);
  BufferRegistration on_0 = Request('b', 0, 32);
  on_0.device = 0;
  absl::StatusOr<RegisteredBuffer> b = registry.Register(on_0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->device, 0);
  // The allocation of `a` is on device 2: a second window of it named on device 0 is refused.
  BufferRegistration again = Request('a', 64, 64);
  again.device = 0;
  refused = registry.Register(again);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("the allocation is on device 2"),
            absl::string_view::npos)
      << refused.status();

  absl::StatusOr<BufferLease> lease = registry.Acquire(a->buffer_id, 0, 64, 0);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->device, 2);
  EXPECT_EQ(registry.counters(2).registrations, 1u);
  EXPECT_EQ(registry.counters(2).registered_bytes, 64u);
  EXPECT_EQ(registry.counters(2).open_handles, 1u);
  EXPECT_EQ(registry.counters(0).registered_bytes, 32u);
  EXPECT_EQ(registry.counters(1).registrations, 0u);
  EXPECT_EQ(registry.counters().registrations, 2u);
  std::vector<BufferListing> listed = registry.List();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].device, 2);
  EXPECT_EQ(listed[1].device, 0);

  const uint64_t session = sessions.Open(1);
  EventRegistration event = EventRequest(session);
  EXPECT_EQ(events.Register(event).status().code(), absl::StatusCode::kInvalidArgument);
  event.device = 2;
  absl::StatusOr<uint64_t> id = events.Register(event);
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<EventLease> held = events.Acquire(*id, session);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->device, 2);
  EXPECT_EQ(events.size(2), 1u);
  EXPECT_EQ(events.size(0), 0u);
}

// With one device, a registration that names none is on it (today's clients, which send no
// device, keep working).
TEST(BufferRegistryDevicesTest, OneDeviceTakesRegistrationsThatNameNone) {
  FakeOpener opener;
  SessionTable sessions;
  BufferRegistry registry({3}, &sessions, &opener, BufferRegistryLimits{8, 1 << 20, true});
  absl::StatusOr<RegisteredBuffer> a = registry.Register(Request('a', 0, 64));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->device, 3);
  BufferRegistration other = Request('b', 0, 64);
  other.device = 0;
  EXPECT_NE(registry.Register(other).status().message().find(
                "this server serves CUDA device 3; the buffer is on device 0"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace probesidecar::server
