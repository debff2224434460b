// The copy of a CUDA executor's probe-outcome counters to the host: every placed set's counters
// (the label slots in use) and each stream slot's running total of non-finite device scores, to
// pinned host memory in one batch on the device health's probe stream, one wait, then each copy
// published (what OutcomeCounts and the metrics read). Run by the executor's device monitor when
// a copy is asked for, however many Score requests ran since; on a CUDA error the previous copies
// stay.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/executors/cuda/device_health.h"
#include "server/executors/cuda/device_outcome_counters.h"
#include "server/executors/cuda/cuda_worker.h"

namespace probesidecar::server {

class OutcomeCopier {
 public:
  explicit OutcomeCopier(int device) : device_(device) {}
  // Frees the pinned memory unless Abandon was called.
  ~OutcomeCopier();
  OutcomeCopier(const OutcomeCopier&) = delete;
  OutcomeCopier& operator=(const OutcomeCopier&) = delete;

  // The counters of a set placed on the device (weakly held: they go with their set).
  void Track(const std::shared_ptr<DeviceOutcomeCounters>& counters);

  // One copy of everything tracked, and of the non-finite totals of `workers`' score runners
  // (monitor thread only).
  void Copy(DeviceHealth& health, const std::vector<Worker>& workers);

  // Leaves the pinned memory to the process's exit (the executor stopped with the device busy).
  void Abandon() { abandoned_ = true; }

 private:
  // Pinned memory of at least `words` words; false when it cannot be had.
  bool Reserve(int64_t words);

  const int device_;
  absl::Mutex mu_;
  std::vector<std::weak_ptr<DeviceOutcomeCounters>> tracked_ ABSL_GUARDED_BY(mu_);
  uint64_t* host_ = nullptr;  // pinned, the copy target (monitor thread only)
  int64_t host_words_ = 0;
  bool abandoned_ = false;
};

}  // namespace probesidecar::server
