// LoadProbeSet, UnloadProbeSet (admin only) and ListProbeSets. Loading reads the file and uploads
// the weights on the control worker; the executor's workers then capture the set's graphs, and
// the last of them answers.
#include <memory>
#include <utility>

#include "server/observability/log.h"
#include "server/rpc/outcome_report.h"
#include "server/rpc/proto_conversion.h"
#include "server/rpc/rpc_helpers.h"
#include "server/rpc/service.h"

namespace probesidecar::server {

grpc::ServerUnaryReactor* ProbeSidecarService::LoadProbeSet(grpc::CallbackServerContext* context,
                                                            const v1::LoadProbeSetRequest* request,
                                                            v1::LoadProbeSetResponse* response) {
  if (absl::Status admin = authorizer_.AuthorizeAdmin(context); !admin.ok()) {
    return Refuse(context, Rpc::kLoadProbeSet, admin);
  }
  // Checked here, before any work: a bad value loads nothing.
  absl::StatusOr<kernels::ProbePrecisionRequest> precision =
      FromProtoPrecision(request->precision());
  if (!precision.ok()) return Refuse(context, Rpc::kLoadProbeSet, precision.status());
  absl::StatusOr<bool> counted =
      FromProtoOutcomeCounting(request->outcome_counting(), env_.config.count_outcomes);
  if (!counted.ok()) return Refuse(context, Rpc::kLoadProbeSet, counted.status());
  const ProbeSetOptions options(*precision, *counted);
  // Reading the file, uploading the weights and capturing graphs all wait (disk, device): the
  // control worker loads, the executor's workers capture, and the last of them answers.
  return AnswerFromControlWorker(
      context, Rpc::kLoadProbeSet, /*refuse_while_draining=*/true,
      [this, request, response, options](Finish finish) {
        absl::StatusOr<std::shared_ptr<const ProbeSet>> loaded;
        switch (request->source_case()) {
          case v1::LoadProbeSetRequest::kPath:
            loaded = env_.probes->LoadFromPath(request->name(), request->path(), request->replace(),
                                               options);
            break;
          case v1::LoadProbeSetRequest::kSafetensors:
            loaded = env_.probes->LoadFromBytes(request->name(), request->safetensors(),
                                                request->replace(), options);
            break;
          case v1::LoadProbeSetRequest::SOURCE_NOT_SET:
            loaded = absl::InvalidArgumentError(
                "LoadProbeSet needs a source: a server path or the safetensors bytes");
            break;
        }
        if (!loaded.ok()) {
          std::move(finish)(loaded.status());
          return;
        }
        std::shared_ptr<const ProbeSet> set = std::move(*loaded);
        FillProbeSetInfo(*set, response->mutable_probe_set());
        LogInfo("loaded probe set '%s': P=%d H=%d %s from %s%s", set->name, set->num_probes,
                set->hidden, kernels::ProbePrecisionName(set->precision), set->source,
                set->count_outcomes ? "" : " (outcomes not counted)");
        env_.executor->Warmup(
            set, [name = set->name, finish = std::move(finish)](absl::Status status) mutable {
              // The set is loaded either way: a failed warm-up only means first requests capture.
              if (!status.ok()) LogWarning("warm-up of probe set '%s': %s", name, status.message());
              std::move(finish)(absl::OkStatus());
            });
      });
}

grpc::ServerUnaryReactor* ProbeSidecarService::UnloadProbeSet(
    grpc::CallbackServerContext* context, const v1::UnloadProbeSetRequest* request,
    v1::UnloadProbeSetResponse* /*response*/) {
  if (absl::Status admin = authorizer_.AuthorizeAdmin(context); !admin.ok()) {
    return Refuse(context, Rpc::kUnloadProbeSet, admin);
  }
  return AnswerFromControlWorker(context, Rpc::kUnloadProbeSet, /*refuse_while_draining=*/false,
                                 [this, request](Finish finish) {
                                   absl::Status status = env_.probes->Unload(request->name());
                                   if (status.ok()) {
                                     LogInfo("unloaded probe set '%s'", request->name());
                                   }
                                   std::move(finish)(status);
                                 });
}

grpc::ServerUnaryReactor* ProbeSidecarService::ListProbeSets(
    grpc::CallbackServerContext* context, const v1::ListProbeSetsRequest* /*request*/,
    v1::ListProbeSetsResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kListProbeSets);
  for (const std::shared_ptr<const ProbeSet>& set : env_.probes->List()) {
    v1::ProbeSetInfo* info = response->add_probe_sets();
    FillProbeSetInfo(*set, info);
    FillProbeOutcomes(*set, env_.executor->OutcomeCounts(*set), *env_.outcome_labels, info);
  }
  // What they show is the last copy from the devices (no gRPC thread waits for one): ask for the
  // next.
  env_.executor->ReadStats({OutcomeCopy::kAsk});
  return Answer(context, Rpc::kListProbeSets, start, absl::OkStatus());
}

}  // namespace probesidecar::server
