// What an executor reports of itself, as one value (Executor::stats): the totals and one entry
// per served device, read by the metrics scrape and ServerInfo. A multi-device executor's is the
// sum of its devices' (operator+=). Plain types, readable without the executor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/observability/stage_timings.h"

namespace probesidecar::server {

// Requests an executor skipped or stopped early because their lifetime had ended, each counted
// once.
struct DroppedRequests {
  uint64_t expired = 0;    // the deadline had passed
  uint64_t cancelled = 0;  // the caller had gone

  DroppedRequests& operator+=(const DroppedRequests& o) {
    expired += o.expired;
    cancelled += o.cancelled;
    return *this;
  }
};

// What one served CUDA device reports (ServerInfo.devices, the metrics' device label).
struct DeviceReport {
  int device = 0;
  std::string name;
  std::string compute_capability;         // "major.minor"
  std::vector<std::string> kernel_paths;  // the kernel paths this build runs there
  uint64_t memory_bytes = 0;              // device memory the service holds there
  uint64_t queued = 0;                    // requests waiting for one of its stream slots
  uint64_t gpu_requests = 0;              // requests its workers ran on the GPU so far
  uint64_t parked_slots = 0;
  GraphCacheCounters graph_cache;
  // Empty while the device serves; why not once its context is lost.
  std::string failure;
};

struct ExecutorStats {
  uint64_t device_memory_bytes = 0;  // device memory the service holds (0 on the CPU backend)
  uint64_t queued = 0;               // requests waiting for a worker
  // Requests that may wait for a worker (--max-queued-requests); more are refused at once.
  uint64_t queue_capacity = 0;
  DroppedRequests dropped;
  // Whether the device context is a client of an MPS control daemon (any device's, summed).
  bool mps = false;
  // Requests that a worker ran on the GPU so far (Score and Verify). Without MPS each one makes
  // the GPU switch between the inference server's context and this one (docs/mps.md).
  uint64_t gpu_requests = 0;
  uint64_t invalid_device_rows = 0;  // row indices from device buffers outside [0, T)
  // Verify requests whose device page tables or lengths were found out of range on the GPU.
  uint64_t invalid_verify_requests = 0;
  // NaN or infinite scores the GPU found in device outputs (host outputs are counted by the
  // service), as of the last copy from the devices (Executor::ReadStats' outcome copy).
  uint64_t non_finite_device_scores = 0;
  // Stream slots out of service because their stream still waits on the GPU for work answered
  // already.
  uint64_t parked_slots = 0;
  GraphCacheCounters graph_cache;
  // One report per served device, ascending by ordinal (empty on the CPU backend).
  std::vector<DeviceReport> devices;

  // Adds another executor's: counters summed, mps if either, its devices after these.
  ExecutorStats& operator+=(const ExecutorStats& o) {
    device_memory_bytes += o.device_memory_bytes;
    queued += o.queued;
    queue_capacity += o.queue_capacity;
    dropped += o.dropped;
    mps = mps || o.mps;
    gpu_requests += o.gpu_requests;
    invalid_device_rows += o.invalid_device_rows;
    invalid_verify_requests += o.invalid_verify_requests;
    non_finite_device_scores += o.non_finite_device_scores;
    parked_slots += o.parked_slots;
    graph_cache += o.graph_cache;
    devices.insert(devices.end(), o.devices.begin(), o.devices.end());
    return *this;
  }
};

}  // namespace probesidecar::server
