#include "server/executors/cuda/outcome_copier.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "server/observability/log.h"

namespace probesidecar::server {

OutcomeCopier::~OutcomeCopier() {
  if (!abandoned_ && host_ != nullptr) cudaFreeHost(host_);
}

void OutcomeCopier::Track(const std::shared_ptr<DeviceOutcomeCounters>& counters) {
  absl::MutexLock lock(&mu_);
  std::erase_if(tracked_, [](const auto& weak) { return weak.expired(); });
  tracked_.push_back(counters);
}

bool OutcomeCopier::Reserve(int64_t words) {
  if (words <= host_words_) return true;
  if (host_ != nullptr) cudaFreeHost(host_);
  host_ = nullptr;
  host_words_ = 0;
  if (cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(uint64_t) * words,
                    cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();
    host_ = nullptr;
    return false;
  }
  host_words_ = words;
  return true;
}

void OutcomeCopier::Copy(DeviceHealth& health, const std::vector<Worker>& workers) {
  if (health.lost()) return;
  std::vector<std::shared_ptr<DeviceOutcomeCounters>> live;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& weak : tracked_) {
      if (auto counters = weak.lock()) live.push_back(std::move(counters));
    }
  }
  std::vector<int64_t> offsets;
  int64_t words = 0;
  for (const auto& counters : live) {
    offsets.push_back(words);
    words += counters->CopyWords();
  }
  // The stream slots' totals come after the counters, one word each.
  const int64_t totals = words;
  if (!Reserve(totals + static_cast<int64_t>(workers.size()))) return;
  std::vector<int> slots(live.size(), 0);
  const cudaError_t e = health.OnProbeStream([&](cudaStream_t stream) {
    cudaError_t error = cudaSuccess;
    for (size_t i = 0; i < live.size() && error == cudaSuccess; ++i) {
      const int64_t capacity = (i + 1 < live.size() ? offsets[i + 1] : totals) - offsets[i];
      error = live[i]->CopyTo(host_ + offsets[i], capacity, stream, &slots[i]);
    }
    for (size_t i = 0; i < workers.size() && error == cudaSuccess; ++i) {
      error = workers[i].score->CopyNonFiniteTotal(host_ + totals + i, stream);
    }
    return error == cudaSuccess ? cudaStreamSynchronize(stream) : error;
  });
  if (e != cudaSuccess) {
    cudaGetLastError();
    LogWarning("copying the probe-outcome counters of device %d: %s: %s", device_,
               cudaGetErrorName(e), cudaGetErrorString(e));
    return;
  }
  for (size_t i = 0; i < live.size(); ++i) live[i]->Publish(host_ + offsets[i], slots[i]);
  for (size_t i = 0; i < workers.size(); ++i) {
    workers[i].score->PublishNonFiniteTotal(host_[totals + i]);
  }
}

}  // namespace probesidecar::server
