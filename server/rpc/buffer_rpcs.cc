// RegisterBuffer, UnregisterBuffer, ListBuffers, RegisterEvent, UnregisterEvent and OpenSession:
// the clients' CUDA IPC buffers and events, and the session (a held-open call) that owns them.
// Opening and closing IPC handles is driver work: it runs on the control worker, never on a gRPC
// thread.
#include <atomic>
#include <map>
#include <string>
#include <utility>

#include "server/ipc/ipc_registries.h"
#include "server/observability/log.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/proto_conversion.h"
#include "server/rpc/rpc_helpers.h"
#include "server/rpc/service.h"

namespace probesidecar::server {
namespace {

// OpenSession: sends the session id, then holds the call open. When it ends — the client
// cancels, its process exits (its connection breaks), or the server drains — the session closes
// and its buffers are released.
class SessionReactor final : public grpc::ServerWriteReactor<v1::SessionEvent>,
                             public DrainableStream {
 public:
  // `ipc`: nullptr on a backend without IPC (the session only carries its labels' slot).
  SessionReactor(ProbeSidecarService* service, SessionTable* sessions, IpcRegistries* ipc,
                 int64_t client_pid, int outcome_slot, bool labels_folded)
      : service_(service),
        sessions_(sessions),
        ipc_(ipc),
        id_(sessions->Open(client_pid, outcome_slot)) {
    LogInfo("session %d opened (pid %d, outcome label slot %d%s)", id_, client_pid, outcome_slot,
            labels_folded ? ": past --max-session-label-sets, counted as _other" : "");
    event_.set_session_id(id_);
    event_.set_labels_folded(labels_folded);
    StartWrite(&event_);
    service_->AddStream(this);
  }

  void Drain() override { End(ToGrpcStatus(ShuttingDown())); }
  void OnWriteDone(bool /*ok*/) override {}  // nothing more to send; OnCancel ends the call
  void OnCancel() override { End(ToGrpcStatus(absl::CancelledError("session ended"))); }
  void OnDone() override {
    if (ipc_ == nullptr) {
      sessions_->Close(id_);
      LogInfo("session %d closed", id_);
    } else {
      // Closing the session's allocations is driver work: on the control worker, not here.
      service_->RunOnControlWorker([ipc = ipc_, id = id_] {
        ipc->CloseSession(id);
        LogInfo("session %d closed: its buffers are released", id);
      });
    }
    service_->RemoveStream(this);
    delete this;
  }

 private:
  // Drain and OnCancel can race; the call is finished once.
  void End(grpc::Status status) {
    if (!ended_.exchange(true)) Finish(std::move(status));
  }

  ProbeSidecarService* const service_;
  SessionTable* const sessions_;
  IpcRegistries* const ipc_;
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
  IpcRegistries* ipc = env_.ipc;
  if (ipc == nullptr)
    return Refuse(context, rpc, NoBuffersOnThisBackend(env_.executor->info().backend.c_str()));
  return AnswerFromControlWorker(context, rpc, /*refuse_while_draining=*/registration,
                                 [ipc, work = std::move(work)](Finish finish) mutable {
                                   std::move(finish)(std::move(work)(*ipc));
                                 });
}

grpc::ServerUnaryReactor* ProbeSidecarService::RegisterBuffer(
    grpc::CallbackServerContext* context, const v1::RegisterBufferRequest* request,
    v1::RegisterBufferResponse* response) {
  // cudaIpcOpenMemHandle takes 60-150 µs.
  return AnswerFromBufferRegistry(
      context, Rpc::kRegisterBuffer, /*registration=*/true,
      [request, response](IpcRegistries& ipc) {
        absl::StatusOr<RegisteredBuffer> registered = ipc.buffers.Register(FromProto(*request));
        if (!registered.ok()) return registered.status();
        FillRegisterBufferResponse(*registered, response);
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
                                  [request, response](IpcRegistries& ipc) {
                                    absl::StatusOr<bool> deferred = ipc.buffers.Unregister(
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
  return AnswerFromBufferRegistry(
      context, Rpc::kRegisterEvent, /*registration=*/true, [request, response](IpcRegistries& ipc) {
        absl::StatusOr<uint64_t> id = ipc.events.Register(FromProto(*request));
        if (!id.ok()) return id.status();
        response->set_event_id(*id);
        LogDebug("registered event %d '%s' (session %d)", *id, request->name(),
                 request->session_id());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ProbeSidecarService::UnregisterEvent(
    grpc::CallbackServerContext* context, const v1::UnregisterEventRequest* request,
    v1::UnregisterEventResponse* /*response*/) {
  return AnswerFromBufferRegistry(
      context, Rpc::kUnregisterEvent, /*registration=*/false, [request](IpcRegistries& ipc) {
        return ipc.events.Unregister(request->event_id(), request->session_id());
      });
}

grpc::ServerUnaryReactor* ProbeSidecarService::ListBuffers(
    grpc::CallbackServerContext* context, const v1::ListBuffersRequest* /*request*/,
    v1::ListBuffersResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kListBuffers);
  // A backend without IPC has no buffers: the list is empty.
  if (env_.ipc != nullptr) {
    for (const BufferListing& listing : env_.ipc->buffers.List()) {
      FillBufferInfo(listing, response->add_buffers());
    }
  }
  return Answer(context, Rpc::kListBuffers, start, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::SessionEvent>* ProbeSidecarService::OpenSession(
    grpc::CallbackServerContext* /*context*/, const v1::OpenSessionRequest* request) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kOpenSession);
  absl::Status refused = Draining();
  bool labels_folded = false;
  absl::StatusOr<int> slot = 0;
  if (refused.ok()) {
    const std::map<std::string, std::string> labels(request->labels().begin(),
                                                    request->labels().end());
    slot = env_.outcome_labels->SlotFor(labels, &labels_folded);
    refused = slot.status();
  }
  // Counted as answered once open: the session's lifetime is not an RPC's duration.
  RecordFinished(Rpc::kOpenSession, start, refused, "", "");
  if (!refused.ok()) return new RefusedSession(ToGrpcStatus(refused));
  if (labels_folded) {
    LogWarning(
        "a session of pid %d declared labels past --max-session-label-sets=%d: its "
        "probe outcomes are counted with every label \"%s\"",
        request->client_pid(), env_.config.max_session_label_sets, OutcomeLabels::kOtherValue);
  }
  return new SessionReactor(this, env_.sessions, env_.ipc, request->client_pid(), *slot,
                            labels_folded);
}

}  // namespace probesidecar::server
