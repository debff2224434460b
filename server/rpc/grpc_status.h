// The one place where absl::Status becomes what a client sees: a call's grpc::Status, or the
// StreamError of one ScoreStream message (the stream goes on).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "probesidecar/v1/score.pb.h"

namespace probesidecar::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

// The same code and message as ToGrpcStatus, for a failed stream message.
void FillStreamError(const absl::Status& status, v1::StreamError* error);

}  // namespace probesidecar::server
