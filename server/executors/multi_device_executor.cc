#include "server/executors/multi_device_executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace probesidecar::server {
namespace {

// What a request whose buffers are on a device this server does not serve answers.
absl::Status NotServed(int device) {
  return absl::InvalidArgumentError(absl::StrCat("the request's buffers are on CUDA device ",
                                                 device, ", which this server does not serve"));
}

}  // namespace

MultiDeviceExecutor::MultiDeviceExecutor(std::vector<int> devices,
                                         std::vector<std::unique_ptr<Executor>> executors)
    : devices_(std::move(devices)), executors_(std::move(executors)) {}

MultiDeviceExecutor::~MultiDeviceExecutor() { Shutdown(); }

const char* MultiDeviceExecutor::backend() const { return executors_.front()->backend(); }

std::string MultiDeviceExecutor::device_name() const {
  const std::string first = executors_.front()->device_name();
  for (const auto& e : executors_) {
    if (e->device_name() != first) {
      std::string names;
      for (const auto& each : executors_) {
        absl::StrAppend(&names, names.empty() ? "" : ", ", each->device_name());
      }
      return names;
    }
  }
  return executors_.size() == 1 ? first : absl::StrCat(first, " (x", executors_.size(), ")");
}

ExecutorStats MultiDeviceExecutor::stats() const {
  ExecutorStats total;
  for (const auto& e : executors_) total += e->stats();
  return total;
}

uint64_t MultiDeviceExecutor::queued() const {
  uint64_t total = 0;
  for (const auto& e : executors_) total += e->queued();
  return total;
}

Executor* MultiDeviceExecutor::For(int device) const {
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i] == device) return executors_[i].get();
  }
  return nullptr;
}

Executor* MultiDeviceExecutor::LeastQueued() const {
  Executor* best = nullptr;
  uint64_t fewest = 0;
  for (const auto& e : executors_) {
    const uint64_t queued = e->queued();
    if (best == nullptr || queued < fewest) {
      best = e.get();
      fewest = queued;
    }
  }
  return best;
}

absl::Status MultiDeviceExecutor::PrepareProbeSet(ProbeSet& set) {
  for (size_t i = 0; i < executors_.size(); ++i) {
    if (absl::Status s = executors_[i]->PrepareProbeSet(set); !s.ok()) {
      set.device_weights.clear();  // the copies placed so far are freed with it
      return absl::Status(s.code(), absl::StrCat("CUDA device ", devices_[i], ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

void MultiDeviceExecutor::Warmup(const std::shared_ptr<const ProbeSet>& set, WarmupDone done) {
  struct Countdown {
    absl::Mutex mu;
    size_t remaining;
    absl::Status status;
    WarmupDone done;
  };
  auto countdown = std::make_shared<Countdown>();
  countdown->remaining = executors_.size();
  countdown->done = std::move(done);
  for (const auto& e : executors_) {
    e->Warmup(set, [countdown](absl::Status status) {
      WarmupDone finished;
      {
        absl::MutexLock lock(&countdown->mu);
        if (countdown->status.ok()) countdown->status = status;
        if (--countdown->remaining == 0) finished = std::move(countdown->done);
      }
      if (finished) std::move(finished)(countdown->status);
    });
  }
}

void MultiDeviceExecutor::Score(std::unique_ptr<ScoreJob> job, ScoreDone done) {
  Executor* executor = job->device.has_value() ? For(*job->device) : LeastQueued();
  if (executor == nullptr) {
    absl::Status refused = NotServed(*job->device);
    std::move(done)(std::move(job), std::move(refused), ScoreTimings{});
    return;
  }
  executor->Score(std::move(job), std::move(done));
}

void MultiDeviceExecutor::Verify(std::unique_ptr<VerifyJob> job, VerifyDone done) {
  Executor* executor = For(job->device);
  if (executor == nullptr) {
    absl::Status refused = NotServed(job->device);
    std::move(done)(std::move(job), std::move(refused), VerifyOutcome{});
    return;
  }
  executor->Verify(std::move(job), std::move(done));
}

kernels::ProbeOutcomeCounts MultiDeviceExecutor::OutcomeCounts(const ProbeSet& set) const {
  kernels::ProbeOutcomeCounts total;
  for (const auto& e : executors_) total.Add(e->OutcomeCounts(set));
  return total;
}
void MultiDeviceExecutor::RefreshOutcomes(absl::Time deadline) {
  // Every device's monitor copies at once; then each is waited for.
  for (const auto& e : executors_) e->RequestOutcomeRefresh();
  for (const auto& e : executors_) e->RefreshOutcomes(deadline);
}
void MultiDeviceExecutor::RequestOutcomeRefresh() {
  for (const auto& e : executors_) e->RequestOutcomeRefresh();
}

void MultiDeviceExecutor::SetFatalHandler(FatalHandler handler) {
  {
    absl::MutexLock lock(&fatal_->mu);
    fatal_->handler = std::move(handler);
  }
  for (size_t i = 0; i < executors_.size(); ++i) {
    executors_[i]->SetFatalHandler([fatal = fatal_, device = devices_[i]](const absl::Status& why) {
      FatalHandler handler;
      {
        absl::MutexLock lock(&fatal->mu);
        if (fatal->fired || !fatal->handler) return;
        fatal->fired = true;
        handler = std::move(fatal->handler);
      }
      handler(absl::Status(why.code(), absl::StrCat("CUDA device ", device, ": ", why.message())));
    });
  }
}

void MultiDeviceExecutor::Shutdown() {
  for (const auto& e : executors_) e->Shutdown();
}

bool MultiDeviceExecutor::ShutdownBy(absl::Time deadline) {
  bool clean = true;
  for (const auto& e : executors_) clean = e->ShutdownBy(deadline) && clean;
  return clean;
}

}  // namespace probesidecar::server
