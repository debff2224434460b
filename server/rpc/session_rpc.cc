// OpenSession: the lease that ties a client's IPC buffers to its connection.
#include <atomic>

#include "server/buffers/buffer_registry.h"
#include "server/observability/log.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/rpc_helpers.h"
#include "server/rpc/service.h"

namespace probesidecar::server {
namespace {

// OpenSession: sends the session id, then holds the call open. When it ends — the client
// cancels, its process exits (its connection breaks), or the server drains — the session's
// buffers are released.
class SessionReactor final : public grpc::ServerWriteReactor<v1::SessionEvent>,
                             public DrainableStream {
 public:
  SessionReactor(ProbeSidecarService* service, BufferRegistry* buffers, int64_t client_pid)
      : service_(service), buffers_(buffers), id_(buffers->OpenSession(client_pid)) {
    LogInfo("session %d opened (pid %d)", id_, client_pid);
    event_.set_session_id(id_);
    StartWrite(&event_);
    service_->AddStream(this);
  }

  void Drain() override {
    End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  }
  void OnWriteDone(bool /*ok*/) override {}  // nothing more to send; OnCancel ends the call
  void OnCancel() override { End(grpc::Status(grpc::StatusCode::CANCELLED, "session ended")); }
  void OnDone() override {
    // Closing the session's allocations is driver work: on the control worker, not here.
    service_->RunOnControlWorker([buffers = buffers_, id = id_] {
      buffers->CloseSession(id);
      LogInfo("session %d closed: its buffers are released", id);
    });
    service_->RemoveStream(this);
    delete this;
  }

 private:
  // Drain and OnCancel can race; the call is finished once.
  void End(grpc::Status status) {
    if (!ended_.exchange(true)) Finish(std::move(status));
  }

  ProbeSidecarService* const service_;
  BufferRegistry* const buffers_;
  const uint64_t id_;
  v1::SessionEvent event_;
  std::atomic<bool> ended_{false};
};

}  // namespace

grpc::ServerWriteReactor<v1::SessionEvent>* ProbeSidecarService::OpenSession(
    grpc::CallbackServerContext* /*context*/, const v1::OpenSessionRequest* request) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kOpenSession);
  BufferRegistry* buffers = env_.executor->buffers();
  absl::Status refused =
      buffers == nullptr ? NoBuffersOnThisBackend(env_.executor->backend()) : Draining();
  const grpc::Status status = ToGrpcStatus(refused);
  env_.metrics->RpcFinished(Rpc::kOpenSession, refused.code(), SecondsSince(start), "", "");
  if (!refused.ok()) {
    class Refuse final : public grpc::ServerWriteReactor<v1::SessionEvent> {
     public:
      explicit Refuse(grpc::Status status) { Finish(std::move(status)); }
      void OnDone() override { delete this; }
    };
    return new Refuse(status);
  }
  return new SessionReactor(this, buffers, request->client_pid());
}

}  // namespace probesidecar::server
