// The service's lifecycle (drain, open streams, work in progress), admission of executor work,
// and the answers of unary RPCs, inline or from the control worker. The handlers are in one file
// per RPC family: buffer_rpcs.cc, probe_set_rpcs.cc, score_rpcs.cc, verify_rpc.cc,
// server_info_rpc.cc.
#include "server/rpc/service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/observability/log.h"
#include "server/rpc/grpc_status.h"

namespace probesidecar::server {
namespace {

// Administrative work waiting for the control worker; past this, such RPCs are refused.
constexpr size_t kControlQueue = 1024;

}  // namespace

ProbeSidecarService::ProbeSidecarService(ServiceEnv env)
    : env_(std::move(env)),
      authorizer_(env_.admin_token, env_.config.admin_tls_identity, env_.admin_unix_gid,
                  env_.unix_peers, env_.server_uid, env_.config.allow_remote_ipc),
      started_(Clock::now()),
      control_(1, kControlQueue) {}

ProbeSidecarService::~ProbeSidecarService() { StopControlWorker(); }

void ProbeSidecarService::AddStream(DrainableStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.insert(stream);
  if (draining_.load()) stream->Drain();
}

void ProbeSidecarService::RemoveStream(DrainableStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

void ProbeSidecarService::BeginDrain() {
  draining_.store(true);
  absl::MutexLock lock(&streams_mu_);
  for (DrainableStream* stream : streams_) stream->Drain();
}

bool ProbeSidecarService::WaitUntilIdle(absl::Time deadline) {
  while (absl::Now() < deadline) {
    {
      absl::MutexLock lock(&streams_mu_);
      if (streams_.empty() && in_flight_.load() == 0) return true;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

void ProbeSidecarService::StopControlWorker() { control_.Shutdown(); }

absl::Status ProbeSidecarService::Draining() const {
  if (!draining_.load()) return absl::OkStatus();
  return ShuttingDown();
}

absl::Status ProbeSidecarService::Admit(const RequestLifetime& lifetime) {
  if (absl::Status draining = Draining(); !draining.ok()) return draining;
  if (absl::Status alive = lifetime.Check(); !alive.ok()) return alive;
  if (admitted_.fetch_add(1) >= env_.config.max_concurrent_requests) {
    admitted_.fetch_sub(1);
    return absl::ResourceExhaustedError(
        absl::StrCat("the server is at its limit of ", env_.config.max_concurrent_requests,
                     " requests in progress (--max-concurrent-requests); retry later"));
  }
  return absl::OkStatus();
}

void ProbeSidecarService::SetListening(std::vector<std::string> listening) {
  absl::MutexLock lock(&listening_mu_);
  listening_ = std::move(listening);
}

void ProbeSidecarService::RecordFinished(Rpc rpc, Clock::time_point start,
                                         const absl::Status& status, absl::string_view probe_set,
                                         absl::string_view kernel_path) {
  env_.metrics->RpcFinished(rpc, status.code(), SecondsSince(start), probe_set, kernel_path);
  // NOT_FOUND is an ordinary answer (an unknown name), not worth a line even at debug level.
  if (!status.ok() && status.code() != absl::StatusCode::kNotFound) {
    LogDebug("%s: %s", RpcName(rpc), status.ToString());
  }
}

grpc::ServerUnaryReactor* ProbeSidecarService::Answer(grpc::CallbackServerContext* context, Rpc rpc,
                                                      Clock::time_point start,
                                                      const absl::Status& status) {
  RecordFinished(rpc, start, status, "", "");
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* ProbeSidecarService::Refuse(grpc::CallbackServerContext* context, Rpc rpc,
                                                      const absl::Status& status) {
  env_.metrics->RpcStarted(rpc);
  return Answer(context, rpc, Clock::now(), status);
}

void ProbeSidecarService::RunOnControlWorker(absl::AnyInvocable<void() &&> work) {
  control_.Submit([work = std::move(work)](int) mutable { std::move(work)(); });
}

void ProbeSidecarService::RunOnControlWorker(Rpc rpc, bool refuse_while_draining, Finish finish,
                                             ControlWork work) {
  const Clock::time_point start = Clock::now();
  // Records the answer once, on whichever thread the work finishes.
  Finish answer = [this, rpc, start,
                   finish = std::move(finish)](const absl::Status& status) mutable {
    RecordFinished(rpc, start, status, "", "");
    std::move(finish)(status);
    in_flight_.fetch_sub(1);
  };
  in_flight_.fetch_add(1);
  if (absl::Status draining = Draining(); refuse_while_draining && !draining.ok()) {
    std::move(answer)(draining);
    return;
  }
  control_.Submit([answer = std::move(answer), work = std::move(work)](int worker) mutable {
    if (worker == WorkerPool::kRefused) {
      std::move(answer)(absl::ResourceExhaustedError(absl::StrCat(
          "too many administrative requests are waiting (", kControlQueue, "); retry later")));
      return;
    }
    std::move(work)(std::move(answer));
  });
}

grpc::ServerUnaryReactor* ProbeSidecarService::AnswerFromControlWorker(
    grpc::CallbackServerContext* context, Rpc rpc, bool refuse_while_draining, ControlWork work) {
  env_.metrics->RpcStarted(rpc);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunOnControlWorker(
      rpc, refuse_while_draining,
      [reactor](const absl::Status& status) { reactor->Finish(ToGrpcStatus(status)); },
      std::move(work));
  return reactor;
}

}  // namespace probesidecar::server
