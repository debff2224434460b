// Verify: validation on the gRPC thread, the MLA verify graph on an executor worker, which
// answers (with the shadow-mode report, when the request compares with its own output); it
// follows the skeleton of executor_rpc.h.
#include <string>
#include <utility>

#include "server/ipc/buffer_registry.h"
#include "server/requests/verify_job.h"
#include "server/rpc/executor_rpc.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/rpc_helpers.h"
#include "server/rpc/service.h"

namespace probesidecar::server {
namespace {

// What is particular to a Verify in the skeleton of executor_rpc.h.
struct VerifyWork : ExecutorWork<v1::VerifyRequest, v1::VerifyResponse, VerifyJob, VerifyResult> {
  static constexpr const char* kName = "Verify";

  // No probe set: `probe_set` stays "".
  absl::StatusOr<VerifyJob> Prepare(const ServiceEnv& env, std::string* /*probe_set*/) const {
    return PrepareVerifyJob(*request, env.ipc, VerifyLimits{});
  }

  void Fill(const VerifyJob& job, const VerifyResult& result, double /*seconds*/,
            Metrics& metrics) const {
    response->set_kernel_path(result.kernel_path);
    if (!result.shadow) return;
    v1::ShadowReport* report = response->mutable_shadow();
    report->set_max_abs_error(result.max_abs_error);
    report->set_rel_l2_error(result.rel_l2_error);
    report->set_compared(static_cast<int64_t>(result.compared));
    report->set_mismatched(static_cast<int64_t>(result.mismatched));
    report->set_atol(job.atol);
    report->set_rtol(job.rtol);
    metrics.ShadowCompared(result.rel_l2_error, result.mismatched > 0);
  }
};

}  // namespace

grpc::ServerUnaryReactor* ProbeSidecarService::Verify(grpc::CallbackServerContext* context,
                                                      const v1::VerifyRequest* request,
                                                      v1::VerifyResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunOnExecutor(Rpc::kVerify, LifetimeOf(context), VerifyWork{{request, response}},
                [reactor](const absl::Status& status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

}  // namespace probesidecar::server
