// A Score request after validation: everything an executor needs, nothing it must check again.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "probesidecar/v1/score.pb.h"
#include "server/probes/probe_registry.h"
#include "server/requests/request_lifetime.h"
#include "server/requests/tensor_ref.h"

namespace probesidecar::server {

struct ScoreLimits {
  uint32_t max_rows = 65536;
  uint64_t max_message_bytes = uint64_t{64} << 20;
};

struct ScoreJob {
  std::shared_ptr<const ProbeSet> probe_set;
  Tensor2D activations;  // [T, H]
  // The rows: host indices, each checked in [0, T) (points into the request), or a device
  // window of R int32 (checked on the GPU).
  const int32_t* rows = nullptr;  // [R], or nullptr when the rows are on the device
  DeviceInt32Vector device_rows;  // set when rows == nullptr
  int32_t num_rows = 0;           // R
  // Which rows count in the probe outcomes (ScoreRequest.counted_rows): G counts in a device
  // window, each of a group of R / G rows; size 0: every row counts.
  DeviceInt32Vector counted_rows;
  // Where the [R, P] float32 scores go: host memory (the response's bytes) or a device window.
  float* host_out = nullptr;
  Tensor2D device_out;  // set when the request names an output buffer
  // GPU-side ordering: the stream waits for `ready` before reading, records `done` after
  // writing (event == nullptr: not named).
  EventLease ready;
  EventLease done;
  // Answer as soon as the work is queued on the GPU (a done event, device activations, device
  // output): nothing of the answer needs the GPU to finish.
  bool enqueue_only = false;
  // Until when the request is worth running (checked by the executor before and while it runs).
  RequestLifetime lifetime;
  // The CUDA device of its buffers and events (all on one); unset when it names none (inline
  // activations and scores: any device may run it).
  std::optional<int> device;
  // The label slot its probe outcomes are counted in: its session's (SessionTable::OutcomeSlot;
  // 0, unlabelled, without one). Set by the service after validation.
  int outcome_slot = 0;

  bool rows_on_device() const { return rows == nullptr; }
};

// Validates `request` against the loaded probe sets and the limits, and points the job's output
// at `scores` (resized to R * P floats) unless the request names an output buffer. Every
// refusal is a precise status: NOT_FOUND (probe set, buffer, event), INVALID_ARGUMENT (shapes,
// dtypes, rows, extents, missing session), PERMISSION_DENIED (another session's event),
// RESOURCE_EXHAUSTED (limits), FAILED_PRECONDITION (buffers or events on the CPU backend).
absl::StatusOr<ScoreJob> PrepareScoreJob(const v1::ScoreRequest& request,
                                         const ProbeRegistry& probes, BufferResolver* buffers,
                                         const ScoreLimits& limits, std::string* scores);

}  // namespace probesidecar::server
