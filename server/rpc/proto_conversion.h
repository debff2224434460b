// The server's own types as the API's messages, and back: probe sets and their precision, buffer
// and event registrations. (Request
// validation, which reads the request messages, is in server/requests/; statuses are in
// grpc_status.h.)
#pragma once

#include "absl/status/statusor.h"
#include "kernels/probe_score/probe_score_precision.h"
#include "probesidecar/v1/buffers.pb.h"
#include "probesidecar/v1/probes.pb.h"
#include "server/ipc/buffer_registry.h"
#include "server/ipc/event_registry.h"
#include "server/probes/probe_set.h"

namespace probesidecar::server {

// Fills `info` from a loaded probe set.
void FillProbeSetInfo(const ProbeSet& set, v1::ProbeSetInfo* info);
// PRECISION_EXACT or PRECISION_FAST (never UNSPECIFIED: a loaded set's precision is resolved).
v1::Precision ToProtoPrecision(kernels::ProbePrecision precision);
// What LoadProbeSetRequest.precision asks for; INVALID_ARGUMENT for a value outside the enum
// (proto3 keeps unknown enum numbers).
absl::StatusOr<kernels::ProbePrecisionRequest> FromProtoPrecision(int value);
// Whether LoadProbeSetRequest.outcome_counting counts the set's outcomes (UNSPECIFIED:
// `by_default`, the server's --probe-outcomes); INVALID_ARGUMENT outside the enum.
absl::StatusOr<bool> FromProtoOutcomeCounting(int value, bool by_default);

BufferRegistration FromProto(const v1::RegisterBufferRequest& request);
EventRegistration FromProto(const v1::RegisterEventRequest& request);
void FillRegisterBufferResponse(const RegisteredBuffer& registered,
                                v1::RegisterBufferResponse* response);
void FillBufferInfo(const BufferListing& listing, v1::BufferInfo* info);

}  // namespace probesidecar::server
