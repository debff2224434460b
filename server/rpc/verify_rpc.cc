// Verify: validation on the gRPC thread, the MLA verify graph on an executor worker, which
// answers (with the shadow-mode report, when the request compares with its own output).
#include <memory>
#include <utility>

#include "server/buffers/buffer_registry.h"
#include "server/observability/log.h"
#include "server/requests/verify_job.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/rpc_helpers.h"
#include "server/rpc/service.h"

namespace probesidecar::server {

grpc::ServerUnaryReactor* ProbeSidecarService::Verify(grpc::CallbackServerContext* context,
                                                      const v1::VerifyRequest* request,
                                                      v1::VerifyResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kVerify);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto fail = [&](const absl::Status& status) {
    env_.metrics->RpcFinished(Rpc::kVerify, status.code(), SecondsSince(start), "", "");
    LogDebug("Verify: %s", status.ToString());
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  };
  if (absl::Status draining = Draining(); !draining.ok()) return fail(draining);
  RequestLifetime lifetime = LifetimeOf(context);
  if (absl::Status alive = lifetime.Check(); !alive.ok()) return fail(alive);
  if (admitted_.fetch_add(1) >= env_.config.max_concurrent_requests) {
    admitted_.fetch_sub(1);
    return fail(absl::ResourceExhaustedError(
        "the server is at its limit of requests in progress (--max-concurrent-requests); retry "
        "later"));
  }
  absl::StatusOr<VerifyJob> prepared =
      PrepareVerifyJob(*request, env_.executor->buffers(), VerifyLimits{});
  if (!prepared.ok()) {
    admitted_.fetch_sub(1);
    return fail(prepared.status());
  }
  auto job = std::make_unique<VerifyJob>(std::move(*prepared));
  job->lifetime = std::move(lifetime);
  const VerifyJob* raw_job = job.get();
  in_flight_.fetch_add(1);
  env_.executor->Verify(raw_job, [this, start, response, reactor, job = std::move(job)](
                                     absl::Status status, const VerifyOutcome& outcome) mutable {
    // Done, but past the deadline or with the caller gone nobody gets the answer.
    if (status.ok()) status = job->lifetime.Check();
    if (status.ok()) {
      response->set_kernel_path(outcome.kernel_path);
      if (outcome.shadow) {
        v1::ShadowReport* report = response->mutable_shadow();
        report->set_max_abs_error(outcome.max_abs_error);
        report->set_rel_l2_error(outcome.rel_l2_error);
        report->set_compared(static_cast<int64_t>(outcome.compared));
        report->set_mismatched(static_cast<int64_t>(outcome.mismatched));
        report->set_atol(job->atol);
        report->set_rtol(job->rtol);
        env_.metrics->ShadowCompared(outcome.rel_l2_error, outcome.mismatched > 0);
      }
    } else if (status.code() == absl::StatusCode::kInternal) {
      env_.metrics->CudaError();
      LogError("Verify failed: %s", status.ToString());
    }
    job.reset();  // releases the buffer and event leases before the answer goes out
    admitted_.fetch_sub(1);
    env_.metrics->RpcFinished(Rpc::kVerify, status.code(), SecondsSince(start), "",
                              status.ok() ? outcome.kernel_path : "");
    reactor->Finish(ToGrpcStatus(status));
    in_flight_.fetch_sub(1);
  });
  return reactor;
}

}  // namespace probesidecar::server
