// ThreadSanitizer builds only: teaches TSan what absl::Mutex, absl::CondVar and
// absl::Notification do.
//
// Debian's abseil is a shared library built without -fsanitize=thread, so TSan sees neither its
// atomics nor its futex waits: every access guarded by an absl::Mutex would be reported as a race.
// abseil's own source annotates itself for TSan (the __tsan_mutex_* calls below) only when it is
// compiled with TSan. This file interposes on the entry points the project and gRPC use: it
// defines them in the executable, so that our code and the shared libraries (gRPC's included) bind
// to these definitions, adds the same annotations abseil would add, and calls the real function
// found with dlsym(RTLD_NEXT). Between pre- and post-annotations TSan ignores memory accesses, as
// it does inside an instrumented abseil (a waiter's Condition may be evaluated by the unlocking
// thread).
//
// Linked into every executable of a PROBESIDECAR_SANITIZE=thread build, never into another.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#if !defined(__SANITIZE_THREAD__) && !(defined(__has_feature) && __has_feature(thread_sanitizer))
#error "tsan_absl_mutex.cc belongs in ThreadSanitizer builds only"
#endif

namespace {

#define PROBESIDECAR_STR2(x) #x
#define PROBESIDECAR_STR(x) PROBESIDECAR_STR2(x)

// The real definition of absl::<ns>::<cls>::<rest> (mangled), e.g. Real("N", "5Mutex", "4LockEv")
// for absl::Mutex::Lock() ("NK" for a const method). A missing symbol is a broken build: stop at
// once with the name.
void* Real(const char* nested, const char* cls, const char* rest) {
  const char* ns = PROBESIDECAR_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name =
      std::string("_Z") + nested + "4absl" + std::to_string(std::strlen(ns)) + ns + cls + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found in abseil\n", name.c_str());
    std::abort();  // a test binary that cannot run at all; never the server's request path
  }
  return fn;
}

template <typename Fn>
Fn RealFn(const char* cls, const char* rest, const char* nested = "N") {
  return reinterpret_cast<Fn>(Real(nested, cls, rest));
}

constexpr unsigned kRead = __tsan_mutex_read_lock;

// abseil calls its own entry points (CondVar::WaitWithTimeout calls WaitWithDeadline, which lands
// here again): only the outermost call on a thread annotates.
thread_local int depth = 0;
struct Outermost {
  Outermost() : outer(depth++ == 0) {}
  ~Outermost() { --depth; }
  const bool outer;
};

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const auto real = RealFn<void (*)(Mutex*)>("5Mutex", "4LockEv");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_lock(this, 0);
  real(this);
  if (o.outer) __tsan_mutex_post_lock(this, 0, 0);
}

bool Mutex::TryLock() {
  static const auto real = RealFn<bool (*)(Mutex*)>("5Mutex", "7TryLockEv");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  if (o.outer) {
    __tsan_mutex_post_lock(this,
                           __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  }
  return locked;
}

void Mutex::Unlock() {
  static const auto real = RealFn<void (*)(Mutex*)>("5Mutex", "6UnlockEv");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_unlock(this, 0);
  real(this);
  if (o.outer) __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderLock() {
  static const auto real = RealFn<void (*)(Mutex*)>("5Mutex", "10ReaderLockEv");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_lock(this, kRead);
  real(this);
  if (o.outer) __tsan_mutex_post_lock(this, kRead, 0);
}

void Mutex::ReaderUnlock() {
  static const auto real = RealFn<void (*)(Mutex*)>("5Mutex", "12ReaderUnlockEv");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_unlock(this, kRead);
  real(this);
  if (o.outer) __tsan_mutex_post_unlock(this, kRead);
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto real =
      RealFn<void (*)(Mutex*, const Condition&)>("5Mutex", "8LockWhenERKNS0_9ConditionE");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_lock(this, 0);
  real(this, cond);
  if (o.outer) __tsan_mutex_post_lock(this, 0, 0);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = RealFn<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "5Mutex", "19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_lock(this, 0);
  const bool met = real(this, cond, timeout);
  if (o.outer) __tsan_mutex_post_lock(this, 0, 0);  // held on return either way
  return met;
}

// Await releases the mutex while it waits and holds it again on return: to TSan, an unlock
// before and a lock after.
void Mutex::Await(const Condition& cond) {
  static const auto real =
      RealFn<void (*)(Mutex*, const Condition&)>("5Mutex", "5AwaitERKNS0_9ConditionE");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_unlock(this, 0);
  real(this, cond);
  if (o.outer) __tsan_mutex_post_unlock(this, 0);
  if (o.outer) __tsan_mutex_pre_lock(this, 0);
  if (o.outer) __tsan_mutex_post_lock(this, 0, 0);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = RealFn<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "5Mutex", "16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_unlock(this, 0);
  const bool met = real(this, cond, timeout);
  if (o.outer) __tsan_mutex_post_unlock(this, 0);
  if (o.outer) __tsan_mutex_pre_lock(this, 0);
  if (o.outer) __tsan_mutex_post_lock(this, 0, 0);
  return met;
}

// CondVar waits release the mutex and hold it again on return, like Await. gRPC's own
// synchronisation is built on them (it calls these entry points too, so they land here).
void CondVar::Wait(Mutex* mu) {
  static const auto real = RealFn<void (*)(CondVar*, Mutex*)>("7CondVar", "4WaitEPNS0_5MutexE");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_unlock(mu, 0);
  real(this, mu);
  if (o.outer) __tsan_mutex_post_unlock(mu, 0);
  if (o.outer) __tsan_mutex_pre_lock(mu, 0);
  if (o.outer) __tsan_mutex_post_lock(mu, 0, 0);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static const auto real = RealFn<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "7CondVar", "15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_unlock(mu, 0);
  const bool timed_out = real(this, mu, timeout);
  if (o.outer) __tsan_mutex_post_unlock(mu, 0);
  if (o.outer) __tsan_mutex_pre_lock(mu, 0);
  if (o.outer) __tsan_mutex_post_lock(mu, 0, 0);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static const auto real = RealFn<bool (*)(CondVar*, Mutex*, absl::Time)>(
      "7CondVar", "16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  const Outermost o;
  if (o.outer) __tsan_mutex_pre_unlock(mu, 0);
  const bool timed_out = real(this, mu, deadline);
  if (o.outer) __tsan_mutex_post_unlock(mu, 0);
  if (o.outer) __tsan_mutex_pre_lock(mu, 0);
  if (o.outer) __tsan_mutex_post_lock(mu, 0, 0);
  return timed_out;
}

// Notify happens before every return from a wait that saw it.
void Notification::Notify() {
  static const auto real = RealFn<void (*)(Notification*)>("12Notification", "6NotifyEv");
  const Outermost o;
  if (o.outer) __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real =
      RealFn<void (*)(const Notification*)>("12Notification", "19WaitForNotificationEv", "NK");
  const Outermost o;
  real(this);
  if (o.outer) __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  static const auto real = RealFn<bool (*)(const Notification*, absl::Duration)>(
      "12Notification", "30WaitForNotificationWithTimeoutENS0_8DurationE", "NK");
  const Outermost o;
  const bool notified = real(this, timeout);
  if (o.outer && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
