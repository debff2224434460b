#include "client/cpp/session.h"

#include <unistd.h>

namespace probesidecar::client {

absl::StatusOr<std::unique_ptr<Session>> Session::Open(Client& client) {
  std::unique_ptr<Session> session(new Session());
  v1::OpenSessionRequest request;
  request.set_client_pid(getpid());
  session->reader_ = client.stub().OpenSession(&session->context_, request);
  v1::SessionEvent event;
  if (!session->reader_->Read(&event)) {
    absl::Status status = FromGrpc(session->reader_->Finish());
    session->reader_.reset();  // finished: the destructor must not finish it again
    return status;
  }
  session->id_ = event.session_id();
  return session;
}

Session::~Session() {
  if (reader_ == nullptr) return;
  context_.TryCancel();
  reader_->Finish();
}

}  // namespace probesidecar::client
