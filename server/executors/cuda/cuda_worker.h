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
// result and callback, how it runs on a worker, and where its queue time goes.
struct ScoreRequest {
  using Job = ScoreJob;
  using Result = ScoreTimings;
  using Done = ScoreDone;
  static constexpr const char* kName = "Score";
  static double& QueueSeconds(Result& timings) { return timings.queue; }
  // TEST-ONLY (score_fault_hook.h): the fault this request enqueues once its client's event has
  // completed, if any.
  FaultLaunch fault = nullptr;
  absl::Status Run(Worker& worker, const Job& job, Result* timings) const {
    if (fault == nullptr) return worker.score->Run(job, timings, &timings->enqueued);
    worker.slot->ArmFault(fault);
    absl::Status status = worker.score->Run(job, timings, &timings->enqueued);
    worker.slot->ArmFault(nullptr);  // this request's only: unused where it ended early
    return status;
  }
  static bool Enqueued(const Result& timings) { return timings.enqueued; }
};

struct VerifyRequest {
  using Job = VerifyJob;
  using Result = VerifyResult;
  using Done = VerifyDone;
  static constexpr const char* kName = "Verify";
  static double& QueueSeconds(Result& result) { return result.queue_seconds; }
  absl::Status Run(Worker& worker, const Job& job, Result* result) const {
    return worker.verify->Run(job, result);
  }
  static bool Enqueued(const Result&) { return false; }
};

}  // namespace probesidecar::server
