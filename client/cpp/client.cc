#include "client/cpp/client.h"

#include <chrono>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace probesidecar::client {

using Stub = v1::ProbeSidecar::Stub;

v1::TensorRef InlineTensor(v1::DType dtype, int64_t rows, int64_t cols, std::string bytes,
                           int64_t row_stride) {
  v1::TensorRef ref;
  ref.set_dtype(dtype);
  ref.add_shape(rows);
  ref.add_shape(cols);
  ref.set_row_stride(row_stride);
  ref.set_data(std::move(bytes));
  return ref;
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

namespace {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  return grpc::CreateCustomChannel(
      target, options.credentials ? options.credentials : grpc::InsecureChannelCredentials(), args);
}

}  // namespace

Client::Client(const std::string& target, ClientOptions options)
    : Client(MakeChannel(target, options), options) {}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : options_(options), channel_(std::move(channel)), stub_(v1::ProbeSidecar::NewStub(channel_)) {}

void Client::Prepare(grpc::ClientContext& context) const {
  if (options_.timeout_seconds > 0) {
    context.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::microseconds(static_cast<int64_t>(options_.timeout_seconds * 1e6)));
  }
}

void Client::PrepareAdmin(grpc::ClientContext& context) const {
  Prepare(context);
  if (!options_.admin_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + options_.admin_token);
  }
}

template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Client::Call(Stub& stub, UnaryMethod<Stub, Request, Response> method,
                                      const Request& request, Access access) const {
  grpc::ClientContext context;
  if (access == Access::kAdmin) {
    PrepareAdmin(context);
  } else {
    Prepare(context);
  }
  Response response;
  const grpc::Status status = (stub.*method)(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

absl::StatusOr<std::string> Client::Health(const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> response =
      Call(*stub, &grpc::health::v1::Health::Stub::Check, request);
  if (!response.ok()) return response.status();
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response->status());
}

absl::StatusOr<v1::ServerInfoResponse> Client::ServerInfo() {
  return Call(*stub_, &Stub::ServerInfo, v1::ServerInfoRequest());
}

absl::StatusOr<std::vector<v1::ProbeSetInfo>> Client::ListProbeSets() {
  absl::StatusOr<v1::ListProbeSetsResponse> response =
      Call(*stub_, &Stub::ListProbeSets, v1::ListProbeSetsRequest());
  if (!response.ok()) return response.status();
  return std::vector<v1::ProbeSetInfo>(response->probe_sets().begin(),
                                       response->probe_sets().end());
}

const char* PrecisionName(v1::Precision precision) {
  switch (precision) {
    case v1::PRECISION_EXACT:
      return "exact";
    case v1::PRECISION_FAST:
      return "fast";
    default:
      return "";
  }
}

absl::StatusOr<v1::Precision> ParsePrecision(absl::string_view text) {
  if (text == "default") return v1::PRECISION_UNSPECIFIED;
  if (text == "exact") return v1::PRECISION_EXACT;
  if (text == "fast") return v1::PRECISION_FAST;
  return absl::InvalidArgumentError(
      absl::StrCat("precision '", text, "': expected default, exact or fast"));
}

absl::StatusOr<v1::OutcomeCounting> ParseOutcomeCounting(absl::string_view text) {
  if (text == "default") return v1::OUTCOME_COUNTING_UNSPECIFIED;
  if (text == "on") return v1::OUTCOME_COUNTING_ON;
  if (text == "off") return v1::OUTCOME_COUNTING_OFF;
  return absl::InvalidArgumentError(
      absl::StrCat("outcomes '", text, "': expected default, on or off"));
}

absl::StatusOr<v1::ProbeSetInfo> Client::LoadProbeSet(v1::LoadProbeSetRequest request,
                                                      const LoadOptions& options) {
  request.set_replace(options.replace);
  request.set_precision(options.precision);
  request.set_outcome_counting(options.outcome_counting);
  absl::StatusOr<v1::LoadProbeSetResponse> response =
      Call(*stub_, &Stub::LoadProbeSet, request, Access::kAdmin);
  if (!response.ok()) return response.status();
  return response->probe_set();
}

absl::StatusOr<v1::ProbeSetInfo> Client::LoadProbeSetFromPath(const std::string& name,
                                                              const std::string& path,
                                                              const LoadOptions& options) {
  v1::LoadProbeSetRequest request;
  request.set_name(name);
  request.set_path(path);
  return LoadProbeSet(std::move(request), options);
}

absl::StatusOr<v1::ProbeSetInfo> Client::LoadProbeSetFromBytes(const std::string& name,
                                                               std::string safetensors,
                                                               const LoadOptions& options) {
  v1::LoadProbeSetRequest request;
  request.set_name(name);
  request.set_safetensors(std::move(safetensors));
  return LoadProbeSet(std::move(request), options);
}

absl::Status Client::UnloadProbeSet(const std::string& name) {
  v1::UnloadProbeSetRequest request;
  request.set_name(name);
  return Call(*stub_, &Stub::UnloadProbeSet, request, Access::kAdmin).status();
}

ScoreResult ToScoreResult(const v1::ScoreResponse& response) {
  ScoreResult result;
  result.num_rows = response.num_rows();
  result.num_probes = response.num_probes();
  result.non_finite = response.non_finite_scores();
  result.scores.resize(response.scores().size() / sizeof(float));
  std::memcpy(result.scores.data(), response.scores().data(), result.scores.size() * sizeof(float));
  result.fired.assign(response.fired().begin(), response.fired().end());
  result.kernel_path = response.kernel_path();
  result.precision = PrecisionName(response.precision());
  return result;
}

absl::StatusOr<v1::ScoreResponse> Client::Score(const v1::ScoreRequest& request) {
  return Call(*stub_, &Stub::Score, request);
}

absl::StatusOr<ScoreResult> Client::Score(const v1::TensorRef& activations,
                                          absl::Span<const int32_t> rows,
                                          const std::string& probe_set) {
  v1::ScoreRequest request;
  *request.mutable_activations() = activations;
  request.mutable_rows()->Add(rows.begin(), rows.end());
  request.set_probe_set(probe_set);
  absl::StatusOr<v1::ScoreResponse> response = Score(request);
  if (!response.ok()) return response.status();
  return ToScoreResult(*response);
}

absl::StatusOr<v1::RegisterBufferResponse> Client::RegisterBuffer(
    const v1::RegisterBufferRequest& request) {
  return Call(*stub_, &Stub::RegisterBuffer, request);
}

absl::StatusOr<uint64_t> Client::RegisterEvent(const v1::RegisterEventRequest& request) {
  absl::StatusOr<v1::RegisterEventResponse> response =
      Call(*stub_, &Stub::RegisterEvent, request);
  if (!response.ok()) return response.status();
  return response->event_id();
}

absl::Status Client::UnregisterEvent(uint64_t event_id, uint64_t session_id) {
  v1::UnregisterEventRequest request;
  request.set_event_id(event_id);
  request.set_session_id(session_id);
  return Call(*stub_, &Stub::UnregisterEvent, request).status();
}

absl::StatusOr<v1::VerifyResponse> Client::Verify(const v1::VerifyRequest& request) {
  return Call(*stub_, &Stub::Verify, request);
}

absl::StatusOr<bool> Client::UnregisterBuffer(uint64_t buffer_id, uint64_t session_id) {
  v1::UnregisterBufferRequest request;
  request.set_buffer_id(buffer_id);
  request.set_session_id(session_id);
  absl::StatusOr<v1::UnregisterBufferResponse> response =
      Call(*stub_, &Stub::UnregisterBuffer, request);
  if (!response.ok()) return response.status();
  return response->deferred();
}

absl::StatusOr<std::vector<v1::BufferInfo>> Client::ListBuffers() {
  absl::StatusOr<v1::ListBuffersResponse> response =
      Call(*stub_, &Stub::ListBuffers, v1::ListBuffersRequest());
  if (!response.ok()) return response.status();
  return std::vector<v1::BufferInfo>(response->buffers().begin(), response->buffers().end());
}

}  // namespace probesidecar::client
