// The executor interface: where Score requests run (the CPU's threads, or a GPU's stream slots).
//
// Threading contract: Score and Warmup never block the caller — they queue the work and return;
// the completion callback runs exactly once, on one of the executor's own threads (or on the
// caller's thread when the work is refused at once).
//
// Lifetime: a job whose RequestLifetime has ended when a worker takes it (deadline passed, caller
// gone) is not run, and answers DEADLINE_EXCEEDED or CANCELLED; the CPU backend also checks
// between the tasks of a running job and stops it early. PrepareProbeSet may wait for the device
// (it uploads weights): callers run it on a thread of their own, never on a gRPC thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/probe_outcomes/probe_outcomes.h"
#include "server/observability/executor_stats.h"
#include "server/observability/stage_timings.h"
#include "server/probes/probe_set.h"
#include "server/requests/score_job.h"
#include "server/requests/verify_job.h"

namespace probesidecar::server {

// A job is owned by the executor from Score (or Verify) until its completion callback, which gets
// it back: releasing the job releases its leases (buffers, events, the probe set).
using ScoreDone = absl::AnyInvocable<void(std::unique_ptr<ScoreJob> job, absl::Status status,
                                          const ScoreTimings& timings) &&>;
using WarmupDone = absl::AnyInvocable<void(absl::Status status) &&>;

// How a Verify went.
struct VerifyOutcome {
  const char* kernel_path = "";
  double queue_seconds = 0;  // waiting for a worker
  // Shadow mode: ours against the caller's output.
  bool shadow = false;
  double max_abs_error = 0;
  double rel_l2_error = 0;
  uint64_t compared = 0;
  uint64_t mismatched = 0;
};
using VerifyDone = absl::AnyInvocable<void(std::unique_ptr<VerifyJob> job, absl::Status status,
                                           const VerifyOutcome& outcome) &&>;

class Executor {
 public:
  virtual ~Executor() = default;

  // "cpu" or "cuda".
  virtual const char* backend() const = 0;
  virtual std::string device_name() const = 0;

  // Called once per probe set before it is published (e.g. to upload device weights). May wait
  // for the device.
  virtual absl::Status PrepareProbeSet(ProbeSet& set) = 0;

  // The CUDA devices it serves, on which clients may register IPC buffers and events; empty when
  // the backend has none (the CPU backend: inline tensors only).
  virtual std::vector<int> devices() const { return {}; }

  // Called once a probe set is published: captures its graphs for the configured row buckets on
  // every stream slot, then calls `done` (from any thread). Does not wait.
  virtual void Warmup(const std::shared_ptr<const ProbeSet>& set, WarmupDone done) {
    std::move(done)(absl::OkStatus());
  }

  // Takes `job`, queues it and returns; calls `done` exactly once with the job, from one of the
  // executor's threads — or at once, with RESOURCE_EXHAUSTED (the queue is full) or UNAVAILABLE
  // (shut down). DEADLINE_EXCEEDED or CANCELLED: its lifetime ended first. A job runs on its
  // device (job->device: that of its buffers; unset for inline tensors: any device).
  virtual void Score(std::unique_ptr<ScoreJob> job, ScoreDone done) = 0;

  // MLA verify attention (CUDA backend): like Score, queued, `done` called exactly once.
  virtual void Verify(std::unique_ptr<VerifyJob> job, VerifyDone done) {
    std::move(done)(std::move(job), absl::FailedPreconditionError("Verify needs the CUDA backend"),
                    {});
  }

  // What it reports of itself (ServerInfo, metrics scrapes): readable from any thread at any time
  // without waiting.
  virtual ExecutorStats stats() const { return {}; }
  // Requests waiting for a worker (stats().queued): one atomic read, cheap enough for the request
  // path, where a multi-device executor routes a job that names no device by it.
  virtual uint64_t queued() const { return 0; }
  // The device's compute capability, "major.minor" (empty on the CPU backend), and the kernel
  // paths this build runs on it (ServerInfo; fixed at start-up).
  virtual std::string compute_capability() const { return ""; }
  virtual std::vector<std::string> kernel_paths() const { return {}; }

  // What the probes of `set` found, per label slot (ScoreJob::outcome_slot), summed over the
  // served devices: on the CPU backend as counted so far, on the CUDA backend as of the last copy
  // from the devices (RefreshOutcomes). Readable from any thread without waiting.
  virtual kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet& set) const { return {}; }
  // The CUDA backend copies every set's outcome counters from each device (its device monitor
  // thread does, one copy per set and label slot in use, then one wait) and this waits for that
  // copy until `deadline` at most (a device that does not answer keeps its previous copy). The
  // metrics scrape calls it, never a gRPC thread. Returns at once on the CPU backend.
  virtual void RefreshOutcomes(absl::Time deadline) {}
  // Asks for that copy without waiting for it (ServerInfo and ListProbeSets, on gRPC threads:
  // what they read is the previous copy, the next read sees this one).
  virtual void RequestOutcomeRefresh() {}

  // `handler` is called once, from any thread, when the executor can no longer serve at all
  // (the GPU's CUDA context is lost after a sticky error); requests then fail with UNAVAILABLE.
  // Set before serving; an empty handler removes it.
  using FatalHandler = absl::AnyInvocable<void(const absl::Status& why)>;
  virtual void SetFatalHandler(FatalHandler handler) {}

  // Finishes queued work and stops the threads. No Score after this.
  virtual void Shutdown() = 0;
  // Shutdown, waiting for the device until `deadline` at most: false when work was still pending
  // there (a stream waiting for a client's event that never came, or a lost context). The device
  // resources are then left to the process's exit, which must not wait for the device either
  // (RunServer ends the process without the CUDA runtime's teardown).
  virtual bool ShutdownBy(absl::Time deadline) {
    Shutdown();
    return true;
  }
};

}  // namespace probesidecar::server
