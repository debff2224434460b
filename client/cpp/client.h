// C++ client library for Probe Sidecar.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "probesidecar/v1/sidecar.grpc.pb.h"

namespace probesidecar::client {

struct ClientOptions {
  double timeout_seconds = 30.0;  // per call; <= 0: none
  int max_message_bytes = 64 << 20;
  // TLS for TCP targets (grpc::SslCredentials); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Sent as "authorization: Bearer <token>" with LoadProbeSet and UnloadProbeSet (a server run
  // with --admin-token-file); empty: not sent.
  std::string admin_token;
};

struct ScoreResult {
  int32_t num_rows = 0;        // R
  int32_t num_probes = 0;      // P
  std::vector<float> scores;   // [R, P]
  std::vector<int32_t> fired;  // flat indices r * P + p of finite scores at or above threshold
  std::string kernel_path;
  int32_t non_finite = 0;  // scores that are NaN or infinite (they never fire)
  std::string precision;   // the probe set's: "exact" or "fast" (PrecisionName)
};

// "exact", "fast", or "" for PRECISION_UNSPECIFIED (a server that predates precision).
const char* PrecisionName(v1::Precision precision);
// "default" (PRECISION_UNSPECIFIED: the server's rule, exact up to 2 probes, fast above),
// "exact" or "fast"; INVALID_ARGUMENT otherwise.
absl::StatusOr<v1::Precision> ParsePrecision(absl::string_view text);
// "default" (OUTCOME_COUNTING_UNSPECIFIED: the server's --probe-outcomes), "on" or "off";
// INVALID_ARGUMENT otherwise.
absl::StatusOr<v1::OutcomeCounting> ParseOutcomeCounting(absl::string_view text);

// How LoadProbeSet loads a set: replace one of that name; its precision (UNSPECIFIED: the
// server's default rule; the result's precision is the one the set got); whether its outcomes
// are counted (UNSPECIFIED: the server's --probe-outcomes).
struct LoadOptions {
  bool replace = false;
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  v1::OutcomeCounting outcome_counting = v1::OUTCOME_COUNTING_UNSPECIFIED;
};

// An inline activation tensor [rows, cols] (row_stride in elements, 0 = contiguous).
v1::TensorRef InlineTensor(v1::DType dtype, int64_t rows, int64_t cols, std::string bytes,
                           int64_t row_stride = 0);

// grpc::Status -> absl::Status, keeping code and message.
absl::Status FromGrpc(const grpc::Status& status);

class Client {
 public:
  // target: "unix:/path", "unix:///path" or "host:port". The channel connects lazily.
  explicit Client(const std::string& target, ClientOptions options = {});
  // On an existing channel (tests, custom credentials).
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  // The grpc.health.v1 status name: "SERVING", "NOT_SERVING", ...
  absl::StatusOr<std::string> Health(const std::string& service = "");
  absl::StatusOr<v1::ServerInfoResponse> ServerInfo();
  absl::StatusOr<std::vector<v1::ProbeSetInfo>> ListProbeSets();
  // path: on the server, inside its --probes directory.
  absl::StatusOr<v1::ProbeSetInfo> LoadProbeSetFromPath(const std::string& name,
                                                        const std::string& path,
                                                        const LoadOptions& options = {});
  absl::StatusOr<v1::ProbeSetInfo> LoadProbeSetFromBytes(const std::string& name,
                                                         std::string safetensors,
                                                         const LoadOptions& options = {});
  absl::Status UnloadProbeSet(const std::string& name);

  absl::StatusOr<ScoreResult> Score(const v1::TensorRef& activations,
                                    absl::Span<const int32_t> rows, const std::string& probe_set);
  // The raw call, for callers that build requests themselves (and benchmarks).
  absl::StatusOr<v1::ScoreResponse> Score(const v1::ScoreRequest& request);

  // CUDA IPC buffers (CUDA backend).
  absl::StatusOr<v1::RegisterBufferResponse> RegisterBuffer(
      const v1::RegisterBufferRequest& request);
  // session_id: the session that registered it. True: deferred (requests still use it).
  absl::StatusOr<bool> UnregisterBuffer(uint64_t buffer_id, uint64_t session_id);
  absl::StatusOr<std::vector<v1::BufferInfo>> ListBuffers();
  // CUDA IPC events for GPU-side ordering (owned by a session; see cuda_buffer.h).
  absl::StatusOr<uint64_t> RegisterEvent(const v1::RegisterEventRequest& request);
  absl::Status UnregisterEvent(uint64_t event_id, uint64_t session_id);

  // MLA verify attention (CUDA backend, registered buffers).
  absl::StatusOr<v1::VerifyResponse> Verify(const v1::VerifyRequest& request);

  v1::ProbeSidecar::Stub& stub() { return *stub_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  void Prepare(grpc::ClientContext& context) const;
  // Prepare, plus the admin token.
  void PrepareAdmin(grpc::ClientContext& context) const;
  // Either load: `request` with its source, the options added.
  absl::StatusOr<v1::ProbeSetInfo> LoadProbeSet(v1::LoadProbeSetRequest request,
                                                const LoadOptions& options);

  // Who a call is made as: anyone, or the admin (the token is sent).
  enum class Access { kAnyone, kAdmin };
  template <typename Stub, typename Request, typename Response>
  using UnaryMethod = grpc::Status (Stub::*)(grpc::ClientContext*, const Request&, Response*);
  // One unary call with this client's deadline (and the admin token for kAdmin): the response,
  // or the call's status.
  template <typename Stub, typename Request, typename Response>
  absl::StatusOr<Response> Call(Stub& stub, UnaryMethod<Stub, Request, Response> method,
                                const Request& request, Access access = Access::kAnyone) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ProbeSidecar::Stub> stub_;
};

// Converts a response into a ScoreResult.
ScoreResult ToScoreResult(const v1::ScoreResponse& response);

}  // namespace probesidecar::client
