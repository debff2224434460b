// The gRPC service (callback API): validates each request, hands the work to the executor and
// answers with a precise status. No exception crosses an RPC; no request can crash the server.
#pragma once

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "probesidecar/v1/sidecar.grpc.pb.h"
#include "server/config.h"
#include "server/executor.h"
#include "server/metrics.h"
#include "server/probe_registry.h"

namespace probesidecar::server {

struct ServiceEnv {
  Config config;
  std::string metrics_listening;  // the bound metrics address, "" when off
  ProbeRegistry* probes = nullptr;
  Executor* executor = nullptr;
  Metrics* metrics = nullptr;
};

// A long-lived stream that must end when the server drains.
class DrainableStream {
 public:
  virtual ~DrainableStream() = default;
  // Ends the stream as soon as it is idle (at once if it is), with UNAVAILABLE.
  virtual void Drain() = 0;
};

class ProbeSidecarService final : public v1::ProbeSidecar::CallbackService {
 public:
  explicit ProbeSidecarService(ServiceEnv env);

  // The bound addresses (ports resolved), for ServerInfo; set once the server has started.
  void SetListening(std::vector<std::string> listening);

  grpc::ServerUnaryReactor* RegisterBuffer(grpc::CallbackServerContext* context,
                                           const v1::RegisterBufferRequest* request,
                                           v1::RegisterBufferResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterBuffer(grpc::CallbackServerContext* context,
                                             const v1::UnregisterBufferRequest* request,
                                             v1::UnregisterBufferResponse* response) override;
  grpc::ServerUnaryReactor* ListBuffers(grpc::CallbackServerContext* context,
                                        const v1::ListBuffersRequest* request,
                                        v1::ListBuffersResponse* response) override;
  grpc::ServerWriteReactor<v1::SessionEvent>* OpenSession(
      grpc::CallbackServerContext* context, const v1::OpenSessionRequest* request) override;
  grpc::ServerUnaryReactor* LoadProbeSet(grpc::CallbackServerContext* context,
                                         const v1::LoadProbeSetRequest* request,
                                         v1::LoadProbeSetResponse* response) override;
  grpc::ServerUnaryReactor* UnloadProbeSet(grpc::CallbackServerContext* context,
                                           const v1::UnloadProbeSetRequest* request,
                                           v1::UnloadProbeSetResponse* response) override;
  grpc::ServerUnaryReactor* ListProbeSets(grpc::CallbackServerContext* context,
                                          const v1::ListProbeSetsRequest* request,
                                          v1::ListProbeSetsResponse* response) override;
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* context,
                                  const v1::ScoreRequest* request,
                                  v1::ScoreResponse* response) override;
  grpc::ServerBidiReactor<v1::ScoreRequest, v1::ScoreResponse>* ScoreStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* ServerInfo(grpc::CallbackServerContext* context,
                                       const v1::ServerInfoRequest* request,
                                       v1::ServerInfoResponse* response) override;

  // Shutdown, first step: new RPCs get UNAVAILABLE, open streams end once idle; in-flight work
  // goes on. Then WaitUntilIdle, then grpc::Server::Shutdown.
  void BeginDrain();
  // True once no request is in progress and no stream is open; false at the deadline.
  bool WaitUntilIdle(absl::Time deadline);

  // Streams register so that BeginDrain can end them.
  void AddStream(DrainableStream* stream);
  void RemoveStream(DrainableStream* stream);

  // Validates and runs one Score (unary or stream message); `finish` is called exactly once,
  // possibly from an executor thread, after `response` is filled.
  using ScoreFinish = absl::AnyInvocable<void(const absl::Status& status) &&>;
  void RunScore(Rpc rpc, const v1::ScoreRequest* request, v1::ScoreResponse* response,
                ScoreFinish finish);

 private:
  // Answers a unary RPC whose work is done inline, recording its metrics.
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, Rpc rpc,
                                   std::chrono::steady_clock::time_point start,
                                   const absl::Status& status);

  // UNAVAILABLE once draining.
  absl::Status Draining() const;

  const ServiceEnv env_;
  const std::chrono::steady_clock::time_point started_;
  std::atomic<uint32_t> in_flight_{0};
  std::atomic<bool> draining_{false};
  absl::Mutex streams_mu_;
  std::set<DrainableStream*> streams_ ABSL_GUARDED_BY(streams_mu_);
  mutable absl::Mutex listening_mu_;
  std::vector<std::string> listening_ ABSL_GUARDED_BY(listening_mu_);
};

// Fills `info` from a loaded probe set.
void FillProbeSetInfo(const ProbeSet& set, v1::ProbeSetInfo* info);

}  // namespace probesidecar::server
