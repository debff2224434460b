#include "server/executors/cuda/device_outcome_counters.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/executors/cuda/cuda_status.h"

namespace probesidecar::server {

DeviceOutcomeCounters::DeviceOutcomeCounters(kernels::ProbeOutcomeLayout layout, int slots,
                                             std::atomic<int64_t>* device_bytes)
    : layout_(layout),
      device_bytes_(device_bytes),
      slots_(static_cast<size_t>(std::max(slots, 1))),
      published_(layout, 0) {}

absl::StatusOr<std::unique_ptr<DeviceOutcomeCounters>> DeviceOutcomeCounters::Create(
    const ProbeSet& set, int slots, std::atomic<int64_t>* device_bytes) {
  const kernels::ProbeOutcomeLayout layout{set.num_probes,
                                           static_cast<int32_t>(set.score_bounds.size())};
  std::unique_ptr<DeviceOutcomeCounters> counters(
      new DeviceOutcomeCounters(layout, slots, device_bytes));
  const std::vector<float> thresholds = ThresholdsOrNaN(set);
  PS_RETURN_IF_CUDA(kernels::CreateProbeOutcomeTables(thresholds.data(), set.score_bounds.data(),
                                                      layout, &counters->tables_));
  *device_bytes += static_cast<int64_t>(sizeof(float) * (thresholds.size() + layout.num_bounds));
  return counters;
}

DeviceOutcomeCounters::~DeviceOutcomeCounters() {
  const int64_t slot_bytes = static_cast<int64_t>(sizeof(uint64_t)) * layout_.SlotWords();
  for (auto& slot : slots_) {
    if (unsigned long long* words = slot.load(std::memory_order_acquire)) {
      cudaFree(words);
      *device_bytes_ -= slot_bytes;
    }
  }
  if (tables_.storage != nullptr) {
    kernels::DestroyProbeOutcomeTables(&tables_);
    *device_bytes_ -=
        static_cast<int64_t>(sizeof(float) * (layout_.num_probes + layout_.num_bounds));
  }
}

absl::StatusOr<unsigned long long*> DeviceOutcomeCounters::Slot(int slot, cudaStream_t stream) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) {
    return absl::InternalError(absl::StrCat("outcome slot ", slot, " out of range"));
  }
  std::atomic<unsigned long long*>& entry = slots_[slot];
  if (unsigned long long* words = entry.load(std::memory_order_acquire)) return words;
  absl::MutexLock lock(&alloc_mu_);
  if (unsigned long long* words = entry.load(std::memory_order_acquire)) return words;
  unsigned long long* words = nullptr;
  PS_RETURN_IF_CUDA(kernels::CreateProbeOutcomeCounters(layout_, stream, &words));
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    cudaFree(words);
    return CudaStatus(e, "zeroing probe-outcome counters");
  }
  *device_bytes_ += static_cast<int64_t>(sizeof(uint64_t)) * layout_.SlotWords();
  entry.store(words, std::memory_order_release);
  return words;
}

int64_t DeviceOutcomeCounters::CopyWords() const {
  int used = 0;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].load(std::memory_order_acquire) != nullptr) used = static_cast<int>(s) + 1;
  }
  return used * layout_.SlotWords();
}

cudaError_t DeviceOutcomeCounters::CopyTo(uint64_t* host, int64_t capacity, cudaStream_t stream,
                                          int* slots) {
  const int64_t words = layout_.SlotWords();
  // A slot allocated since the caller sized `host` waits for the next copy.
  const int used = static_cast<int>(std::min(CopyWords(), capacity) / words);
  for (int s = 0; s < used; ++s) {
    const unsigned long long* device = slots_[s].load(std::memory_order_acquire);
    if (device == nullptr) {
      std::memset(host + s * words, 0, sizeof(uint64_t) * words);
      continue;
    }
    if (const cudaError_t e = cudaMemcpyAsync(host + s * words, device, sizeof(uint64_t) * words,
                                              cudaMemcpyDeviceToHost, stream);
        e != cudaSuccess) {
      return e;
    }
  }
  *slots = used;
  return cudaSuccess;
}

void DeviceOutcomeCounters::Publish(const uint64_t* host, int slots) {
  kernels::ProbeOutcomeCounts copy(layout_, slots);
  std::memcpy(copy.words.data(), host, sizeof(uint64_t) * copy.words.size());
  absl::MutexLock lock(&copy_mu_);
  published_ = std::move(copy);
}

kernels::ProbeOutcomeCounts DeviceOutcomeCounters::Read() const {
  absl::MutexLock lock(&copy_mu_);
  return published_;
}

}  // namespace probesidecar::server
