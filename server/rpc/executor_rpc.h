// The one skeleton of the RPCs whose work runs on the executor (Score, each ScoreStream message,
// Verify), and what each kind of request supplies to it: a `Work` (ScoreWork in score_rpcs.cc,
// VerifyWork in verify_rpc.cc) that is an ExecutorWork and has
//
//   static constexpr const char* kName;  // for the error log: "Score", "Verify"
//   // Validation, on the gRPC thread. `probe_set` is set to the name of the request's probe set
//   // when it is loaded (a metrics label: a client must not be able to grow the label set).
//   absl::StatusOr<Job> Prepare(const ServiceEnv& env, std::string* probe_set);
//   // Fills the response of work that succeeded (on the executor's thread); `seconds` since the
//   // request arrived.
//   void Fill(const Job& job, const Result& result, double seconds, Metrics& metrics);
//
// Private to server/rpc/: included by the files that define a Work.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/executors/executor.h"
#include "server/observability/log.h"
#include "server/rpc/rpc_helpers.h"
#include "server/rpc/service.h"

namespace probesidecar::server {

// The call's request and response, and the types of its job (the validated request: ScoreJob,
// VerifyJob) and of what the executor reports with its status (ScoreTimings, VerifyResult).
template <typename Request, typename Response, typename JobType, typename ResultType>
struct ExecutorWork {
  using Job = JobType;
  using Result = ResultType;
  const Request* request;
  Response* response;
};

// The executor's entry point for each kind of job.
inline void SubmitToExecutor(Executor& executor, std::unique_ptr<ScoreJob> job, ScoreDone done) {
  executor.Score(std::move(job), std::move(done));
}
inline void SubmitToExecutor(Executor& executor, std::unique_ptr<VerifyJob> job, VerifyDone done) {
  executor.Verify(std::move(job), std::move(done));
}

// 1. Admission, on the gRPC thread: counted in the metrics; refused while draining, once the
//    call's lifetime has ended, or past --max-concurrent-requests (Admit).
// 2. Validation (Work::Prepare): a refusal is answered at once.
// 3. Hand-off: the job goes to the executor, which calls back exactly once, and the gRPC thread
//    returns.
// 4. Completion, on the executor's thread: work done after its deadline passed or its caller went
//    is answered as what the caller saw; a success fills the response (Work::Fill); INTERNAL is a
//    CUDA error (counted and logged). The job, and with it its leases on buffers, events and the
//    probe set, is released before the answer goes out; the request is counted out of the
//    in-flight work only after `finish`, so that a drain waits for the answer.
template <typename Work>
void ProbeSidecarService::RunOnExecutor(Rpc rpc, RequestLifetime lifetime, Work work,
                                        Finish finish) {
  using Job = typename Work::Job;
  using Result = typename Work::Result;
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(rpc);
  if (absl::Status admitted = Admit(lifetime); !admitted.ok()) {
    RecordFinished(rpc, start, admitted, "", "");
    std::move(finish)(admitted);
    return;
  }
  std::string probe_set;
  absl::StatusOr<Job> prepared = work.Prepare(env_, &probe_set);
  if (!prepared.ok()) {
    admitted_.fetch_sub(1);
    RecordFinished(rpc, start, prepared.status(), probe_set, "");
    std::move(finish)(prepared.status());
    return;
  }
  auto job = std::make_unique<Job>(std::move(*prepared));
  job->lifetime = std::move(lifetime);
  in_flight_.fetch_add(1);
  // The executor owns the job until it calls back with it.
  SubmitToExecutor(*env_.executor, std::move(job),
                   [this, rpc, start, work = std::move(work), probe_set = std::move(probe_set),
                    finish = std::move(finish)](std::unique_ptr<Job> job, absl::Status status,
                                                const Result& result) mutable {
                     if (status.ok()) status = job->lifetime.Check();
                     if (status.ok()) {
                       work.Fill(*job, result, SecondsSince(start), *env_.metrics);
                     } else if (status.code() == absl::StatusCode::kInternal) {
                       env_.metrics->CudaError();
                       if (probe_set.empty()) {
                         LogError("%s failed: %s", Work::kName, status.ToString());
                       } else {
                         LogError("%s on probe set '%s' failed: %s", Work::kName, probe_set,
                                  status.ToString());
                       }
                     }
                     job.reset();
                     admitted_.fetch_sub(1);
                     RecordFinished(rpc, start, status, probe_set, result.kernel_path);
                     std::move(finish)(status);
                     in_flight_.fetch_sub(1);
                   });
}

}  // namespace probesidecar::server
