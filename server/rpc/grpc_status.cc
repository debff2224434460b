#include "server/rpc/grpc_status.h"

#include <string>

namespace probesidecar::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the canonical numbering (google.rpc.Code).
  return grpc::Status(static_cast<grpc::StatusCode>(status.raw_code()),
                      std::string(status.message()));
}

}  // namespace probesidecar::server
