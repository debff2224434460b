#include "server/rpc/grpc_status.h"

#include <string>

namespace probesidecar::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the canonical numbering (google.rpc.Code).
  return grpc::Status(static_cast<grpc::StatusCode>(status.raw_code()),
                      std::string(status.message()));
}

void FillStreamError(const absl::Status& status, v1::StreamError* error) {
  const grpc::Status answer = ToGrpcStatus(status);
  error->set_code(answer.error_code());
  error->set_message(answer.error_message());
}

}  // namespace probesidecar::server
