// One worker thread's share of a CUDA executor (its stream slot and the runners of the two
// request kinds), and what each request kind brings to the executor's one task.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "server/executors/cuda/score_fault_hook.h"
#include "server/executors/cuda/score_runner.h"
#include "server/executors/cuda/stream_slot.h"
#include "server/executors/cuda/verify_runner.h"
#include "server/executors/executor.h"

namespace probesidecar::server {

// One worker thread's share of the executor: its stream slot and the two kinds of request that
// run on it. (Members are destroyed in reverse: the runners before the slot whose stream they use.)
struct Worker {
  std::unique_ptr<StreamSlot> slot;
  std::unique_ptr<ScoreRunner> score;
  std::unique_ptr<VerifyRunner> verify;
};

// What a request kind brings to the executor's one task (CudaExecutor::GpuTask): its job, its
// outcome and callback, how it runs on a worker, and where its queue time goes.
struct ScoreRequest {
  using Job = ScoreJob;
  using Outcome = ScoreTimings;
  using Done = ScoreDone;
  static constexpr const char* kName = "Score";
  static double& QueueSeconds(Outcome& timings) { return timings.queue; }
  // TEST-ONLY (score_fault_hook.h): the fault this request enqueues once its client's event has
  // completed, if any.
  FaultLaunch fault = nullptr;
  absl::Status Run(Worker& worker, const Job& job, Outcome* timings) const {
    if (fault == nullptr) return worker.score->Run(job, timings, &timings->enqueued);
    worker.slot->ArmFault(fault);
    absl::Status status = worker.score->Run(job, timings, &timings->enqueued);
    worker.slot->ArmFault(nullptr);  // this request's only: unused where it ended early
    return status;
  }
  static bool Enqueued(const Outcome& timings) { return timings.enqueued; }
};

struct VerifyRequest {
  using Job = VerifyJob;
  using Outcome = VerifyOutcome;
  using Done = VerifyDone;
  static constexpr const char* kName = "Verify";
  static double& QueueSeconds(Outcome& outcome) { return outcome.queue_seconds; }
  absl::Status Run(Worker& worker, const Job& job, Outcome* outcome) const {
    return worker.verify->Run(job, outcome);
  }
  static bool Enqueued(const Outcome&) { return false; }
};

}  // namespace probesidecar::server
