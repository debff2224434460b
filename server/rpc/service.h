// The gRPC service (callback API): validates each request, hands the work to the executor or to
// the control worker, and answers with a precise status. No exception crosses an RPC; no request
// can crash the server.
//
// Threads: gRPC's callback threads only validate and hand off — they never wait for the GPU, for
// a stream slot or for a file. Score work goes to the executor's workers, which finish the RPC.
// Administrative work that may wait for the device or the disk (loading and unloading probe
// sets, opening and closing IPC buffers, ending sessions) goes to the service's control worker,
// one thread, which finishes those RPCs.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "probesidecar/v1/sidecar.grpc.pb.h"
#include "server/ipc/ipc_registries.h"
#include "server/config/config.h"
#include "server/executors/executor.h"
#include "server/executors/worker_pool.h"
#include "server/observability/metrics.h"
#include "server/observability/outcome_labels.h"
#include "server/probes/probe_registry.h"
#include "server/rpc/authorization.h"
#include "server/rpc/rpc_helpers.h"
#include "server/rpc/unix_listener.h"

namespace probesidecar::server {

struct ServiceEnv {
  Config config;
  std::string metrics_listening;  // the bound metrics address, "" when off
  // Read from --admin-token-file at start ("" when not set).
  std::string admin_token;
  // --admin-unix-group, resolved at start.
  std::optional<gid_t> admin_unix_gid;
  // Who is on the other end of the Unix-socket connections (unix_listener.h); nullptr: no
  // Unix-socket peer is known (and none is admin without a credential).
  const UnixPeers* unix_peers = nullptr;
  // The server's effective uid: its own user is admin on the Unix socket by default.
  uid_t server_uid = 0;
  ProbeRegistry* probes = nullptr;
  Executor* executor = nullptr;
  // The open sessions, and the labels they declare on their outcome series (owned by the server;
  // on every backend).
  SessionTable* sessions = nullptr;
  OutcomeLabels* outcome_labels = nullptr;
  // Buffers and events of the sessions (owned by the server, beside the executor); nullptr when
  // the backend has no devices (no IPC).
  IpcRegistries* ipc = nullptr;
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
  ~ProbeSidecarService() override;

  // The bound addresses (ports resolved), for ServerInfo; set once the server has started.
  void SetListening(std::vector<std::string> listening);

  // buffer_rpcs.cc: CUDA IPC buffers, events and the sessions that own them.
  grpc::ServerUnaryReactor* RegisterBuffer(grpc::CallbackServerContext* context,
                                           const v1::RegisterBufferRequest* request,
                                           v1::RegisterBufferResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterBuffer(grpc::CallbackServerContext* context,
                                             const v1::UnregisterBufferRequest* request,
                                             v1::UnregisterBufferResponse* response) override;
  grpc::ServerUnaryReactor* ListBuffers(grpc::CallbackServerContext* context,
                                        const v1::ListBuffersRequest* request,
                                        v1::ListBuffersResponse* response) override;
  grpc::ServerUnaryReactor* RegisterEvent(grpc::CallbackServerContext* context,
                                          const v1::RegisterEventRequest* request,
                                          v1::RegisterEventResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterEvent(grpc::CallbackServerContext* context,
                                            const v1::UnregisterEventRequest* request,
                                            v1::UnregisterEventResponse* response) override;
  grpc::ServerWriteReactor<v1::SessionEvent>* OpenSession(
      grpc::CallbackServerContext* context, const v1::OpenSessionRequest* request) override;
  // probe_set_rpcs.cc
  grpc::ServerUnaryReactor* LoadProbeSet(grpc::CallbackServerContext* context,
                                         const v1::LoadProbeSetRequest* request,
                                         v1::LoadProbeSetResponse* response) override;
  grpc::ServerUnaryReactor* UnloadProbeSet(grpc::CallbackServerContext* context,
                                           const v1::UnloadProbeSetRequest* request,
                                           v1::UnloadProbeSetResponse* response) override;
  grpc::ServerUnaryReactor* ListProbeSets(grpc::CallbackServerContext* context,
                                          const v1::ListProbeSetsRequest* request,
                                          v1::ListProbeSetsResponse* response) override;
  // score_rpcs.cc
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* context,
                                  const v1::ScoreRequest* request,
                                  v1::ScoreResponse* response) override;
  grpc::ServerBidiReactor<v1::ScoreRequest, v1::ScoreResponse>* ScoreStream(
      grpc::CallbackServerContext* context) override;
  // verify_rpc.cc
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;
  // server_info_rpc.cc
  grpc::ServerUnaryReactor* ServerInfo(grpc::CallbackServerContext* context,
                                       const v1::ServerInfoRequest* request,
                                       v1::ServerInfoResponse* response) override;

  // Shutdown, first step: new RPCs get UNAVAILABLE, open streams end once idle; in-flight work
  // goes on. Then WaitUntilIdle, then grpc::Server::Shutdown, then StopControlWorker.
  void BeginDrain();
  // True once no request is in progress and no stream is open; false at the deadline.
  bool WaitUntilIdle(absl::Time deadline);
  // Finishes the queued administrative work and stops the control worker (after the gRPC
  // server has stopped, before the executor does: releasing a session waits for no request).
  void StopControlWorker();

  // Streams register so that BeginDrain can end them.
  void AddStream(DrainableStream* stream);
  void RemoveStream(DrainableStream* stream);

  // Validates and runs one Score (unary or stream message); `finish` is called exactly once,
  // possibly from an executor thread, after `response` is filled. Past `lifetime` (the call's
  // deadline, or its caller gone) the work is skipped or stopped early.
  using Finish = absl::AnyInvocable<void(const absl::Status& status) &&>;
  void RunScore(Rpc rpc, RequestLifetime lifetime, const v1::ScoreRequest* request,
                v1::ScoreResponse* response, Finish finish);

  // Runs `work` on the control worker; the RPC ends when `work` calls its Finish (on any thread).
  // Refused at once with RESOURCE_EXHAUSTED when the control queue is full, and with UNAVAILABLE
  // while draining when `refuse_while_draining` (new work; releasing work is let through).
  using ControlWork = absl::AnyInvocable<void(Finish finish) &&>;
  void RunOnControlWorker(Rpc rpc, bool refuse_while_draining, Finish finish, ControlWork work);

  // Runs `work` on the control worker, not as an RPC (e.g. releasing a session's buffers); on the
  // calling thread once the control worker has stopped.
  void RunOnControlWorker(absl::AnyInvocable<void() &&> work);

  Metrics* metrics() const { return env_.metrics; }
  IpcRegistries* ipc() const { return env_.ipc; }

 private:
  // The one skeleton of the RPCs whose work runs on the executor (Score, each ScoreStream
  // message, Verify): admission, validation, hand-off and completion. `Work` says what is
  // particular to one kind of request; executor_rpc.h defines both.
  template <typename Work>
  void RunOnExecutor(Rpc rpc, RequestLifetime lifetime, Work work, Finish finish);
  // Admission of a request for the executor: OK (and counted in `admitted_`), or UNAVAILABLE
  // while draining, the lifetime's status once it has ended, RESOURCE_EXHAUSTED past
  // --max-concurrent-requests.
  absl::Status Admit(const RequestLifetime& lifetime);

  // Records the end of an RPC (or stream message) in the metrics and the debug log.
  void RecordFinished(Rpc rpc, Clock::time_point start, const absl::Status& status,
                      absl::string_view probe_set, absl::string_view kernel_path);
  // Answers a unary RPC whose work is done inline, recording its metrics.
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, Rpc rpc,
                                   Clock::time_point start, const absl::Status& status);
  // Answers a unary RPC refused before any work (counted as started and finished).
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context, Rpc rpc,
                                   const absl::Status& status);
  // A unary RPC answered from the control worker.
  grpc::ServerUnaryReactor* AnswerFromControlWorker(grpc::CallbackServerContext* context, Rpc rpc,
                                                    bool refuse_while_draining, ControlWork work);
  // A buffer or event RPC: refused when the backend has no IPC buffers and, for a
  // `registration`, when the peer is not on this host; then `work` runs on the control worker
  // (opening and closing IPC handles is driver work). Registrations are refused while draining;
  // releases are let through.
  using BufferWork = absl::AnyInvocable<absl::Status(IpcRegistries& ipc) &&>;
  grpc::ServerUnaryReactor* AnswerFromBufferRegistry(grpc::CallbackServerContext* context, Rpc rpc,
                                                     bool registration, BufferWork work);

  // UNAVAILABLE once draining.
  absl::Status Draining() const;

  const ServiceEnv env_;
  const Authorizer authorizer_;
  const Clock::time_point started_;
  // RPCs handed to a worker (Score work, control work) and not yet answered.
  std::atomic<uint32_t> in_flight_{0};
  // Of those, Score and Verify requests (bounded by --max-concurrent-requests).
  std::atomic<uint32_t> admitted_{0};
  std::atomic<bool> draining_{false};
  absl::Mutex streams_mu_;
  std::set<DrainableStream*> streams_ ABSL_GUARDED_BY(streams_mu_);
  mutable absl::Mutex listening_mu_;
  std::vector<std::string> listening_ ABSL_GUARDED_BY(listening_mu_);
  WorkerPool control_;  // one thread: administrative work that may wait for the device or disk
};

}  // namespace probesidecar::server
