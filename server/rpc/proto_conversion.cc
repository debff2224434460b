#include "server/rpc/proto_conversion.h"

#include "absl/strings/str_cat.h"
#include "proto/dtype_mapping.h"
#include "server/rpc/outcome_report.h"

namespace probesidecar::server {
v1::Precision ToProtoPrecision(kernels::ProbePrecision precision) {
  return precision == kernels::ProbePrecision::kFast ? v1::PRECISION_FAST : v1::PRECISION_EXACT;
}

absl::StatusOr<kernels::ProbePrecisionRequest> FromProtoPrecision(int value) {
  switch (value) {
    case v1::PRECISION_UNSPECIFIED:
      return kernels::ProbePrecisionRequest::kDefault;
    case v1::PRECISION_EXACT:
      return kernels::ProbePrecisionRequest::kExact;
    case v1::PRECISION_FAST:
      return kernels::ProbePrecisionRequest::kFast;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "precision ", value,
          " is not a Precision (PRECISION_UNSPECIFIED = 0 for the default, PRECISION_EXACT = 1, "
          "PRECISION_FAST = 2)"));
  }
}

absl::StatusOr<bool> FromProtoOutcomeCounting(int value, bool by_default) {
  switch (value) {
    case v1::OUTCOME_COUNTING_UNSPECIFIED:
      return by_default;
    case v1::OUTCOME_COUNTING_ON:
      return true;
    case v1::OUTCOME_COUNTING_OFF:
      return false;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("outcome_counting ", value,
                       " is not an OutcomeCounting (OUTCOME_COUNTING_UNSPECIFIED = 0 for the "
                       "server's --probe-outcomes, OUTCOME_COUNTING_ON = 1, "
                       "OUTCOME_COUNTING_OFF = 2)"));
  }
}

void FillProbeSetInfo(const ProbeSet& set, v1::ProbeSetInfo* info) {
  info->set_name(set.name);
  info->set_num_probes(set.num_probes);
  info->set_hidden_size(set.hidden);
  info->set_weight_dtype(DTypeToProto(set.weight_dtype));
  info->set_activation(set.activation == kernels::Activation::kSigmoid ? v1::ACTIVATION_SIGMOID
                                                                       : v1::ACTIVATION_NONE);
  for (const ProbeSpec& spec : set.probes) {
    v1::Probe* probe = info->add_probes();
    probe->set_name(spec.name);
    if (spec.threshold.has_value()) probe->set_threshold(*spec.threshold);
  }
  info->set_source(set.source);
  info->set_file_bytes(set.file_bytes);
  info->set_precision(ToProtoPrecision(set.precision));
  info->set_outcome_counting(set.count_outcomes ? v1::OUTCOME_COUNTING_ON
                                                : v1::OUTCOME_COUNTING_OFF);
  for (double bound : ScoreBoundsAsDecimals(set)) info->add_score_bucket_bounds(bound);
}

BufferRegistration FromProto(const v1::RegisterBufferRequest& request) {
  BufferRegistration r;
  r.name = request.name();
  if (request.has_device_id()) r.device = request.device_id();
  r.byte_size = request.byte_size();
  r.offset_bytes = request.offset_bytes();
  r.handle = request.handle();
  r.client_pid = request.client_pid();
  r.session_id = request.session_id();
  return r;
}

EventRegistration FromProto(const v1::RegisterEventRequest& request) {
  EventRegistration r;
  r.name = request.name();
  if (request.has_device_id()) r.device = request.device_id();
  r.handle = request.handle();
  r.session_id = request.session_id();
  return r;
}

void FillRegisterBufferResponse(const RegisteredBuffer& registered,
                                v1::RegisterBufferResponse* response) {
  response->set_buffer_id(registered.buffer_id);
  response->set_allocation_bytes(registered.allocation_bytes);
  response->set_shared_mapping(registered.shared_mapping);
}

void FillBufferInfo(const BufferListing& listing, v1::BufferInfo* info) {
  info->set_buffer_id(listing.buffer_id);
  info->set_name(listing.name);
  info->set_device_id(listing.device);
  info->set_offset_bytes(listing.offset_bytes);
  info->set_byte_size(listing.byte_size);
  info->set_allocation_bytes(listing.allocation_bytes);
  info->set_client_pid(listing.client_pid);
  info->set_session_id(listing.session_id);
  info->set_in_flight(listing.in_flight);
  info->set_closing(listing.closing);
}

}  // namespace probesidecar::server
