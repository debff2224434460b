// RegisterBuffer, UnregisterBuffer, ListBuffers, RegisterEvent, UnregisterEvent and OpenSession:
// the clients' CUDA IPC buffers and events, and the session (a held-open call) that owns them.
// Opening and closing IPC handles is driver work: it runs on the control worker, never on a gRPC
// thread.
#include <atomic>
#include <utility>

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

  void Drain() override { End(ToGrpcStatus(ShuttingDown())); }
  void OnWriteDone(bool /*ok*/) override {}  // nothing more to send; OnCancel ends the call
  void OnCancel() override { End(ToGrpcStatus(absl::CancelledError("session ended"))); }
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

// An OpenSession refused at once.
class RefusedSession final : public grpc::ServerWriteReactor<v1::SessionEvent> {
 public:
  explicit RefusedSession(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerUnaryReactor* ProbeSidecarService::AnswerFromBufferRegistry(
    grpc::CallbackServerContext* context, Rpc rpc, bool registration, BufferWork work) {
  if (registration) {
    if (absl::Status local = authorizer_.CheckLocalPeer(context); !local.ok()) {
      return Refuse(context, rpc, local);
    }
  }
  BufferRegistry* buffers = env_.executor->buffers();
  if (buffers == nullptr)
    return Refuse(context, rpc, NoBuffersOnThisBackend(env_.executor->backend()));
  return AnswerFromControlWorker(context, rpc, /*refuse_while_draining=*/registration,
                                 [buffers, work = std::move(work)](Finish finish) mutable {
                                   std::move(finish)(std::move(work)(*buffers));
                                 });
}

grpc::ServerUnaryReactor* ProbeSidecarService::RegisterBuffer(
    grpc::CallbackServerContext* context, const v1::RegisterBufferRequest* request,
    v1::RegisterBufferResponse* response) {
  // cudaIpcOpenMemHandle takes 60-150 µs.
  return AnswerFromBufferRegistry(
      context, Rpc::kRegisterBuffer, /*registration=*/true,
      [request, response](BufferRegistry& buffers) {
        absl::StatusOr<v1::RegisterBufferResponse> registered = buffers.Register(*request);
        if (!registered.ok()) return registered.status();
        *response = std::move(*registered);
        LogInfo(
            "registered buffer %d '%s': %d bytes at offset %d of a %d-byte allocation%s (pid %d)",
            response->buffer_id(), request->name(), request->byte_size(), request->offset_bytes(),
            response->allocation_bytes(), response->shared_mapping() ? " (shared mapping)" : "",
            request->client_pid());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ProbeSidecarService::UnregisterBuffer(
    grpc::CallbackServerContext* context, const v1::UnregisterBufferRequest* request,
    v1::UnregisterBufferResponse* response) {
  return AnswerFromBufferRegistry(context, Rpc::kUnregisterBuffer, /*registration=*/false,
                                  [request, response](BufferRegistry& buffers) {
                                    absl::StatusOr<bool> deferred = buffers.Unregister(
                                        request->buffer_id(), request->session_id());
                                    if (!deferred.ok()) return deferred.status();
                                    response->set_deferred(*deferred);
                                    LogInfo("unregistered buffer %d%s", request->buffer_id(),
                                            *deferred ? " (closes when its requests finish)" : "");
                                    return absl::OkStatus();
                                  });
}

grpc::ServerUnaryReactor* ProbeSidecarService::RegisterEvent(
    grpc::CallbackServerContext* context, const v1::RegisterEventRequest* request,
    v1::RegisterEventResponse* response) {
  return AnswerFromBufferRegistry(context, Rpc::kRegisterEvent, /*registration=*/true,
                                  [request, response](BufferRegistry& buffers) {
                                    absl::StatusOr<uint64_t> id = buffers.RegisterEvent(*request);
                                    if (!id.ok()) return id.status();
                                    response->set_event_id(*id);
                                    LogDebug("registered event %d '%s' (session %d)", *id,
                                             request->name(), request->session_id());
                                    return absl::OkStatus();
                                  });
}

grpc::ServerUnaryReactor* ProbeSidecarService::UnregisterEvent(
    grpc::CallbackServerContext* context, const v1::UnregisterEventRequest* request,
    v1::UnregisterEventResponse* /*response*/) {
  return AnswerFromBufferRegistry(
      context, Rpc::kUnregisterEvent, /*registration=*/false, [request](BufferRegistry& buffers) {
        return buffers.UnregisterEvent(request->event_id(), request->session_id());
      });
}

grpc::ServerUnaryReactor* ProbeSidecarService::ListBuffers(
    grpc::CallbackServerContext* context, const v1::ListBuffersRequest* /*request*/,
    v1::ListBuffersResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kListBuffers);
  // A backend without IPC has no buffers: the list is empty.
  if (BufferRegistry* buffers = env_.executor->buffers(); buffers != nullptr) {
    for (v1::BufferInfo& info : buffers->List()) *response->add_buffers() = std::move(info);
  }
  return Answer(context, Rpc::kListBuffers, start, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::SessionEvent>* ProbeSidecarService::OpenSession(
    grpc::CallbackServerContext* /*context*/, const v1::OpenSessionRequest* request) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kOpenSession);
  BufferRegistry* buffers = env_.executor->buffers();
  const absl::Status refused =
      buffers == nullptr ? NoBuffersOnThisBackend(env_.executor->backend()) : Draining();
  // Counted as answered once open: the session's lifetime is not an RPC's duration.
  RecordFinished(Rpc::kOpenSession, start, refused, "", "");
  if (!refused.ok()) return new RefusedSession(ToGrpcStatus(refused));
  return new SessionReactor(this, buffers, request->client_pid());
}

}  // namespace probesidecar::server
