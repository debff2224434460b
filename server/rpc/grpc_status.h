// The one place where absl::Status becomes grpc::Status.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace probesidecar::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace probesidecar::server
