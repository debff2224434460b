#include "server/executors/cuda/stream_slot.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/executors/cuda/cuda_status.h"

namespace probesidecar::server {
namespace {

// What the host callback of work answered before the GPU finished it receives.
struct DoneCallback {
  StreamSlot* slot;
  StreamSlot::GpuLeases leases;
};

}  // namespace

StreamSlot::StreamSlot(int device, Nudge nudge, const std::atomic<bool>* stopping)
    : device_(device), stopping_(stopping), nudge_(std::move(nudge)) {}

StreamSlot::~StreamSlot() {
  cudaSetDevice(device_);
  QuiesceBy(absl::InfiniteFuture());
  if (completion_ != nullptr) cudaEventDestroy(completion_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status StreamSlot::Init() {
  PS_RETURN_IF_CUDA(cudaSetDevice(device_));
  PS_RETURN_IF_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  PS_RETURN_IF_CUDA(cudaEventCreateWithFlags(&completion_, cudaEventDisableTiming));
  return absl::OkStatus();
}

absl::Status StreamSlot::ReleaseWhenDone(GpuLeases leases) {
  PS_RETURN_IF_CUDA(cudaEventRecord(completion_, stream_));
  return HoldUntilDone(std::move(leases));
}

absl::Status StreamSlot::SignalClientEvent(const EventLease& done) const {
  if (done.event != nullptr) {
    PS_RETURN_IF_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(done.event), stream_));
  }
  return absl::OkStatus();
}

absl::Status StreamSlot::HoldUntilDone(GpuLeases leases) {
  auto* callback = new DoneCallback{this, std::move(leases)};
  if (cudaError_t e = cudaLaunchHostFunc(stream_, &StreamSlot::OnStreamDone, callback);
      e != cudaSuccess) {
    // Not queued (a CUDA error: the context may be lost): the leases must still outlive the work,
    // which may never finish, so they are kept for as long as the slot lives (waiting for the
    // stream here could block forever).
    never_released_.push_back(std::move(callback->leases));
    delete callback;
    return CudaStatus(e, "cudaLaunchHostFunc");
  }
  return absl::OkStatus();
}

void CUDART_CB StreamSlot::OnStreamDone(void* data) {
  // CUDA's callback thread: no CUDA calls here. The leases go to the worker thread.
  std::unique_ptr<DoneCallback> callback(static_cast<DoneCallback*>(data));
  StreamSlot* slot = callback->slot;
  {
    absl::MutexLock lock(&slot->done_mu_);
    slot->done_.push_back(std::move(callback->leases));
  }
  slot->nudge_();
}

void StreamSlot::DrainCompleted() {
  std::vector<GpuLeases> done;
  {
    absl::MutexLock lock(&done_mu_);
    done.swap(done_);
  }
  // `done` goes out of scope here: leases end (deferred unregisters complete) on this thread.
}

absl::Status StreamSlot::PollEvent(cudaEvent_t event, const RequestLifetime& lifetime,
                                   std::chrono::microseconds spin, const char* what) const {
  using std::chrono::microseconds;
  const auto start = std::chrono::steady_clock::now();
  auto next_check = start;
  while (true) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return CudaStatus(e, what);
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_check) {
      // The caller's deadline, its cancellation, and the server stopping end the wait (about
      // every 100 µs).
      next_check = now + microseconds(100);
      absl::Status ended = lifetime.Check();
      if (ended.ok() && stopping_ != nullptr && stopping_->load(std::memory_order_acquire)) {
        ended = absl::UnavailableError(absl::StrCat("the server is stopping: ", what));
      }
      if (!ended.ok()) return ended;
    }
    // Yield through `spin` (where nearly every wait ends), then sleep a twentieth of the wait so
    // far (at most 500 µs), so that a long wait does not burn a core.
    const auto waited = now - start;
    if (waited < spin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(waited / 20, microseconds(500)));
    }
  }
}

absl::Status StreamSlot::FinishOnGpu(const RequestLifetime& lifetime, GpuLeases leases) {
  PS_RETURN_IF_CUDA(cudaEventRecord(completion_, stream_));
  // The first 2 ms spin, as cudaStreamSynchronize would.
  absl::Status s =
      PollEvent(completion_, lifetime, std::chrono::microseconds(2000), "waiting for the GPU");
  if (s.ok() || s.code() == absl::StatusCode::kInternal) return s;
  // Given up (deadline, caller gone, stopping): the GPU work cannot be taken back, so what it
  // uses stays held until it is done.
  if (absl::Status held = HoldUntilDone(std::move(leases)); !held.ok()) return held;
  return s;
}

absl::Status StreamSlot::AwaitClientEvent(const EventLease& ready,
                                          const RequestLifetime& lifetime) {
  if (ready.event != nullptr) {
    const auto event = static_cast<cudaEvent_t>(ready.event);
    if (absl::Status s = PollEvent(event, lifetime, std::chrono::microseconds(200),
                                   "waiting for the client's ready event");
        !s.ok()) {
      return s;
    }
    PS_RETURN_IF_CUDA(cudaStreamWaitEvent(stream_, event, 0));  // met: orders the reads after it
  }
  if (armed_fault_ != nullptr) PS_RETURN_IF_CUDA(std::exchange(armed_fault_, nullptr)(stream_));
  return absl::OkStatus();
}

bool StreamSlot::Idle() const {
  if (completion_ == nullptr) return true;
  return cudaEventQuery(completion_) != cudaErrorNotReady;
}

void StreamSlot::SetParked(bool parked) {
  if (parked) {
    parked_at_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
    park_warned_.store(false, std::memory_order_relaxed);
  }
  parked_.store(parked, std::memory_order_release);
}

double StreamSlot::parked_seconds() const {
  if (!parked()) return 0;
  return 1e-9 * static_cast<double>(absl::GetCurrentTimeNanos() -
                                    parked_at_ns_.load(std::memory_order_relaxed));
}

bool StreamSlot::TakeParkWarning() { return !park_warned_.exchange(true); }

bool StreamSlot::QuiesceBy(absl::Time deadline) {
  if (stream_ != nullptr) {
    while (true) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e != cudaErrorNotReady) break;  // idle, or a CUDA error: nothing more will complete
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Microseconds(200));
    }
  }
  DrainCompleted();
  return true;
}

}  // namespace probesidecar::server
