// The probe-outcome counters of one probe set on one CUDA device (CudaPlacement::outcomes):
// the set's thresholds and bucket bounds on the device (what the count kernel reads), and per
// label slot a block of 64-bit device counters that the graphs of every stream slot add into,
// allocated on the slot's first request. The device monitor copies the allocated blocks to the
// host when asked (CopyTo, then Publish): that copy is what OutcomeCounts reads, so no request
// ever copies counters.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/probe_outcomes/probe_outcomes.h"
#include "server/probes/probe_set.h"

namespace probesidecar::server {

class DeviceOutcomeCounters {
 public:
  // Uploads `set`'s thresholds and bounds to the current device (synchronously: load time only).
  // `slots`: the label slots there can be; `device_bytes` counts the memory held (shared with
  // the executor) and outlives this.
  static absl::StatusOr<std::unique_ptr<DeviceOutcomeCounters>> Create(
      const ProbeSet& set, int slots, std::atomic<int64_t>* device_bytes);
  // Frees the device memory: only once no queued work can count into it (the set's last
  // reference, which every request holds until the GPU is done with it).
  ~DeviceOutcomeCounters();
  DeviceOutcomeCounters(const DeviceOutcomeCounters&) = delete;
  DeviceOutcomeCounters& operator=(const DeviceOutcomeCounters&) = delete;

  const kernels::ProbeOutcomeLayout& layout() const { return layout_; }
  const kernels::ProbeOutcomeTables& tables() const { return tables_; }

  // The counters of label slot `slot`: allocated and zeroed on its first request, on `stream`,
  // which this then waits for (so that other streams see zeros); a worker thread, outside any
  // capture. Found without a lock afterwards.
  absl::StatusOr<unsigned long long*> Slot(int slot, cudaStream_t stream);

  // The words the allocated slots take ([0, last allocated slot], SlotWords() each).
  int64_t CopyWords() const;
  // Enqueues the copy of those slots, as many as `capacity` words hold, into `host` (pinned) on
  // `stream`; `*slots` says how many slots it covers. Unallocated slots before the last are zeroed
  // there.
  cudaError_t CopyTo(uint64_t* host, int64_t capacity, cudaStream_t stream, int* slots);
  // Keeps the copy (once the stream is past it) as what Read returns.
  void Publish(const uint64_t* host, int slots);
  // The last published copy.
  kernels::ProbeOutcomeCounts Read() const;

 private:
  DeviceOutcomeCounters(kernels::ProbeOutcomeLayout layout, int slots,
                        std::atomic<int64_t>* device_bytes);

  const kernels::ProbeOutcomeLayout layout_;
  std::atomic<int64_t>* const device_bytes_;
  kernels::ProbeOutcomeTables tables_;
  // [slots]: each slot's device counters once allocated (only ever set, under alloc_mu_).
  std::vector<std::atomic<unsigned long long*>> slots_;
  absl::Mutex alloc_mu_;
  mutable absl::Mutex copy_mu_;
  kernels::ProbeOutcomeCounts published_ ABSL_GUARDED_BY(copy_mu_);
};

}  // namespace probesidecar::server
