#include "server/service.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/buffer_registry.h"
#include "server/grpc_status.h"
#include "server/log.h"
#include "server/score_job.h"
#include "server/version.h"

namespace probesidecar::server {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

v1::DType ToProtoDType(common::DType dtype) {
  switch (dtype) {
    case common::DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case common::DType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case common::DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::Status NoBuffersOnThisBackend(const char* backend) {
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA IPC buffers need the CUDA backend; this server runs the ", backend,
                   " backend (start it on a GPU host with --backend cuda or auto)"));
}

// Flat indices r * P + p of the scores at or above their probe's threshold.
void FillFired(const ProbeSet& set, const float* scores, int32_t num_rows,
               v1::ScoreResponse* response) {
  for (int32_t r = 0; r < num_rows; ++r) {
    for (int32_t p = 0; p < set.num_probes; ++p) {
      const std::optional<float>& threshold = set.probes[p].threshold;
      const int64_t index = static_cast<int64_t>(r) * set.num_probes + p;
      if (threshold.has_value() && scores[index] >= *threshold) {
        response->add_fired(static_cast<int32_t>(index));
      }
    }
  }
}

// ScoreStream: one message at a time (read, score, write, read ...), so responses come back in
// request order and a slow client cannot queue unbounded work. On drain, an idle stream ends at
// once with UNAVAILABLE and a busy one right after its current answer.
class ScoreStreamReactor final
    : public grpc::ServerBidiReactor<v1::ScoreRequest, v1::ScoreResponse>,
      public DrainableStream {
 public:
  explicit ScoreStreamReactor(ProbeSidecarService* service) : service_(service) {
    service_->AddStream(this);
    StartRead(&request_);
  }

  void Drain() override {
    {
      absl::MutexLock lock(&mu_);
      draining_ = true;
      if (busy_ || finished_) return;
      finished_ = true;
    }
    // The pending read then completes with ok=false.
    Finish(DrainStatus());
  }

  void OnReadDone(bool ok) override {
    bool drain = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      drain = draining_;
      if (!ok || drain) {
        finished_ = true;
      } else {
        busy_ = true;
      }
    }
    if (!ok) {
      // The client half-closed (or the call ended): nothing is in flight.
      Finish(grpc::Status::OK);
      return;
    }
    if (drain) {
      Finish(DrainStatus());
      return;
    }
    response_.Clear();
    service_->RunScore(Rpc::kScoreStream, &request_, &response_,
                       [this](const absl::Status& status) {
                         if (!status.ok()) {
                           response_.Clear();
                           response_.set_request_id(request_.request_id());
                           response_.mutable_error()->set_code(status.raw_code());
                           response_.mutable_error()->set_message(std::string(status.message()));
                         }
                         StartWrite(&response_);
                       });
  }

  void OnWriteDone(bool ok) override {
    bool drain;
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
      drain = draining_;
      if (!ok || drain) finished_ = true;
    }
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled"));
    } else if (drain) {
      Finish(DrainStatus());
    } else {
      StartRead(&request_);
    }
  }

  void OnDone() override {
    service_->RemoveStream(this);
    delete this;
  }

 private:
  static grpc::Status DrainStatus() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
  }

  ProbeSidecarService* const service_;
  v1::ScoreRequest request_;
  v1::ScoreResponse response_;
  absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;      // a message is being scored or written
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called (or decided)
};

}  // namespace

void FillProbeSetInfo(const ProbeSet& set, v1::ProbeSetInfo* info) {
  info->set_name(set.name);
  info->set_num_probes(set.num_probes);
  info->set_hidden_size(set.hidden);
  info->set_weight_dtype(ToProtoDType(set.weight_dtype));
  info->set_activation(set.activation == kernels::Activation::kSigmoid ? v1::ACTIVATION_SIGMOID
                                                                      : v1::ACTIVATION_NONE);
  for (const ProbeSpec& spec : set.probes) {
    v1::Probe* probe = info->add_probes();
    probe->set_name(spec.name);
    if (spec.threshold.has_value()) probe->set_threshold(*spec.threshold);
  }
  info->set_source(set.source);
  info->set_file_bytes(set.file_bytes);
}

ProbeSidecarService::ProbeSidecarService(ServiceEnv env)
    : env_(std::move(env)), started_(Clock::now()) {}

void ProbeSidecarService::AddStream(DrainableStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.insert(stream);
  if (draining_.load()) stream->Drain();
}

void ProbeSidecarService::RemoveStream(DrainableStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

void ProbeSidecarService::BeginDrain() {
  draining_.store(true);
  absl::MutexLock lock(&streams_mu_);
  for (DrainableStream* stream : streams_) stream->Drain();
}

bool ProbeSidecarService::WaitUntilIdle(absl::Time deadline) {
  while (absl::Now() < deadline) {
    {
      absl::MutexLock lock(&streams_mu_);
      if (streams_.empty() && in_flight_.load() == 0) return true;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

absl::Status ProbeSidecarService::Draining() const {
  if (!draining_.load()) return absl::OkStatus();
  return absl::UnavailableError("the server is shutting down");
}

void ProbeSidecarService::SetListening(std::vector<std::string> listening) {
  absl::MutexLock lock(&listening_mu_);
  listening_ = std::move(listening);
}

grpc::ServerUnaryReactor* ProbeSidecarService::Answer(grpc::CallbackServerContext* context,
                                                      Rpc rpc, Clock::time_point start,
                                                      const absl::Status& status) {
  grpc::Status grpc_status = ToGrpcStatus(status);
  env_.metrics->RpcFinished(rpc, grpc_status.error_code(), SecondsSince(start), "", "");
  if (!status.ok() && status.code() != absl::StatusCode::kNotFound) {
    LogDebug("%s: %s", RpcName(rpc), status.ToString());
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(grpc_status));
  return reactor;
}

grpc::ServerUnaryReactor* ProbeSidecarService::RegisterBuffer(
    grpc::CallbackServerContext* context, const v1::RegisterBufferRequest* request,
    v1::RegisterBufferResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kRegisterBuffer);
  BufferRegistry* buffers = env_.executor->buffers();
  if (buffers == nullptr) {
    return Answer(context, Rpc::kRegisterBuffer, start,
                  NoBuffersOnThisBackend(env_.executor->backend()));
  }
  if (absl::Status draining = Draining(); !draining.ok()) {
    return Answer(context, Rpc::kRegisterBuffer, start, draining);
  }
  absl::StatusOr<v1::RegisterBufferResponse> registered = buffers->Register(*request);
  if (registered.ok()) {
    *response = std::move(*registered);
    LogInfo("registered buffer %d '%s': %d bytes at offset %d of a %d-byte allocation%s (pid %d)",
            response->buffer_id(), request->name(), request->byte_size(), request->offset_bytes(),
            response->allocation_bytes(), response->shared_mapping() ? " (shared mapping)" : "",
            request->client_pid());
  }
  return Answer(context, Rpc::kRegisterBuffer, start, registered.status());
}

grpc::ServerUnaryReactor* ProbeSidecarService::UnregisterBuffer(
    grpc::CallbackServerContext* context, const v1::UnregisterBufferRequest* request,
    v1::UnregisterBufferResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kUnregisterBuffer);
  BufferRegistry* buffers = env_.executor->buffers();
  if (buffers == nullptr) {
    return Answer(context, Rpc::kUnregisterBuffer, start,
                  NoBuffersOnThisBackend(env_.executor->backend()));
  }
  absl::StatusOr<bool> deferred = buffers->Unregister(request->buffer_id());
  if (deferred.ok()) {
    response->set_deferred(*deferred);
    LogInfo("unregistered buffer %d%s", request->buffer_id(),
            *deferred ? " (closes when its requests finish)" : "");
  }
  return Answer(context, Rpc::kUnregisterBuffer, start, deferred.status());
}

grpc::ServerUnaryReactor* ProbeSidecarService::ListBuffers(
    grpc::CallbackServerContext* context, const v1::ListBuffersRequest* /*request*/,
    v1::ListBuffersResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kListBuffers);
  // A backend without IPC has no buffers: the list is empty.
  if (BufferRegistry* buffers = env_.executor->buffers(); buffers != nullptr) {
    for (v1::BufferInfo& info : buffers->List()) *response->add_buffers() = std::move(info);
  }
  return Answer(context, Rpc::kListBuffers, start, absl::OkStatus());
}

namespace {

// OpenSession: sends the session id, then holds the call open. When it ends — the client
// cancels, its process exits (its connection breaks), or the server drains — the session's
// buffers are released.
class SessionReactor final : public grpc::ServerWriteReactor<v1::SessionEvent>,
                             public DrainableStream {
 public:
  SessionReactor(ProbeSidecarService* service, BufferRegistry* buffers, int64_t client_pid)
      : service_(service), buffers_(buffers), id_(buffers->OpenSession(client_pid)) {
    LogInfo("session %d opened (pid %d)", id_, client_pid);
    event_.set_session_id(id_);
    StartWrite(&event_);
    service_->AddStream(this);
  }

  void Drain() override {
    End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  }
  void OnWriteDone(bool /*ok*/) override {}  // nothing more to send; OnCancel ends the call
  void OnCancel() override { End(grpc::Status(grpc::StatusCode::CANCELLED, "session ended")); }
  void OnDone() override {
    buffers_->CloseSession(id_);
    LogInfo("session %d closed: its buffers are released", id_);
    service_->RemoveStream(this);
    delete this;
  }

 private:
  // Drain and OnCancel can race; the call is finished once.
  void End(grpc::Status status) {
    if (!ended_.exchange(true)) Finish(std::move(status));
  }

  ProbeSidecarService* const service_;
  BufferRegistry* const buffers_;
  const uint64_t id_;
  v1::SessionEvent event_;
  std::atomic<bool> ended_{false};
};

}  // namespace

grpc::ServerWriteReactor<v1::SessionEvent>* ProbeSidecarService::OpenSession(
    grpc::CallbackServerContext* /*context*/, const v1::OpenSessionRequest* request) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kOpenSession);
  BufferRegistry* buffers = env_.executor->buffers();
  absl::Status refused = buffers == nullptr ? NoBuffersOnThisBackend(env_.executor->backend())
                                            : Draining();
  const grpc::Status status = ToGrpcStatus(refused);
  env_.metrics->RpcFinished(Rpc::kOpenSession, status.error_code(), SecondsSince(start), "", "");
  if (!refused.ok()) {
    class Refuse final : public grpc::ServerWriteReactor<v1::SessionEvent> {
     public:
      explicit Refuse(grpc::Status status) { Finish(std::move(status)); }
      void OnDone() override { delete this; }
    };
    return new Refuse(status);
  }
  return new SessionReactor(this, buffers, request->client_pid());
}

grpc::ServerUnaryReactor* ProbeSidecarService::LoadProbeSet(
    grpc::CallbackServerContext* context, const v1::LoadProbeSetRequest* request,
    v1::LoadProbeSetResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kLoadProbeSet);
  if (absl::Status draining = Draining(); !draining.ok()) {
    return Answer(context, Rpc::kLoadProbeSet, start, draining);
  }
  absl::StatusOr<std::shared_ptr<const ProbeSet>> loaded;
  switch (request->source_case()) {
    case v1::LoadProbeSetRequest::kPath:
      loaded = env_.probes->LoadFromPath(request->name(), request->path(), request->replace());
      break;
    case v1::LoadProbeSetRequest::kSafetensors:
      loaded = env_.probes->LoadFromBytes(request->name(), request->safetensors(),
                                          request->replace());
      break;
    case v1::LoadProbeSetRequest::SOURCE_NOT_SET:
      loaded = absl::InvalidArgumentError(
          "LoadProbeSet needs a source: a server path or the safetensors bytes");
      break;
  }
  if (loaded.ok()) {
    env_.executor->Warmup(*loaded);
    FillProbeSetInfo(**loaded, response->mutable_probe_set());
    LogInfo("loaded probe set '%s': P=%d H=%d from %s", (*loaded)->name, (*loaded)->num_probes,
            (*loaded)->hidden, (*loaded)->source);
  }
  return Answer(context, Rpc::kLoadProbeSet, start, loaded.status());
}

grpc::ServerUnaryReactor* ProbeSidecarService::UnloadProbeSet(
    grpc::CallbackServerContext* context, const v1::UnloadProbeSetRequest* request,
    v1::UnloadProbeSetResponse* /*response*/) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kUnloadProbeSet);
  absl::Status status = env_.probes->Unload(request->name());
  if (status.ok()) LogInfo("unloaded probe set '%s'", request->name());
  return Answer(context, Rpc::kUnloadProbeSet, start, status);
}

grpc::ServerUnaryReactor* ProbeSidecarService::ListProbeSets(
    grpc::CallbackServerContext* context, const v1::ListProbeSetsRequest* /*request*/,
    v1::ListProbeSetsResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kListProbeSets);
  for (const std::shared_ptr<const ProbeSet>& set : env_.probes->List()) {
    FillProbeSetInfo(*set, response->add_probe_sets());
  }
  return Answer(context, Rpc::kListProbeSets, start, absl::OkStatus());
}

void ProbeSidecarService::RunScore(Rpc rpc, const v1::ScoreRequest* request,
                                   v1::ScoreResponse* response, ScoreFinish finish) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(rpc);
  auto fail = [&](const absl::Status& status, absl::string_view probe_set) {
    env_.metrics->RpcFinished(rpc, static_cast<grpc::StatusCode>(status.raw_code()),
                              SecondsSince(start), probe_set, "");
    std::move(finish)(status);
  };
  if (absl::Status draining = Draining(); !draining.ok()) {
    fail(draining, "");
    return;
  }
  if (in_flight_.fetch_add(1) >= env_.config.max_concurrent_requests) {
    in_flight_.fetch_sub(1);
    fail(absl::ResourceExhaustedError(
             absl::StrCat("the server is at its limit of ", env_.config.max_concurrent_requests,
                          " requests in progress (--max-concurrent-requests); retry later")),
         "");
    return;
  }
  ScoreLimits limits;
  limits.max_rows = env_.config.max_rows;
  limits.max_message_bytes = env_.config.max_message_bytes;
  absl::StatusOr<ScoreJob> prepared = PrepareScoreJob(
      *request, *env_.probes, env_.executor->buffers(), limits, response->mutable_scores());
  if (!prepared.ok()) {
    in_flight_.fetch_sub(1);
    // Label only with names that are loaded: a client must not be able to grow the label set.
    const bool known = env_.probes->Find(request->probe_set()) != nullptr;
    fail(prepared.status(), known ? absl::string_view(request->probe_set()) : "");
    return;
  }
  auto job = std::make_unique<ScoreJob>(std::move(*prepared));
  const ScoreJob* raw_job = job.get();
  env_.executor->Score(
      raw_job, [this, rpc, start, request, response, job = std::move(job),
                finish = std::move(finish)](absl::Status status,
                                            const ScoreTimings& timings) mutable {
        const ProbeSet& set = *job->probe_set;
        if (status.ok()) {
          response->set_request_id(request->request_id());
          response->set_num_rows(job->num_rows);
          response->set_num_probes(set.num_probes);
          response->set_kernel_path(timings.kernel_path);
          if (job->host_out != nullptr) FillFired(set, job->host_out, job->num_rows, response);
          env_.metrics->ScoreStages(set.name, timings, SecondsSince(start));
        } else if (status.code() == absl::StatusCode::kInternal) {
          env_.metrics->CudaError();
          LogError("Score on probe set '%s' failed: %s", set.name, status.ToString());
        }
        const std::string probe_set = set.name;
        job.reset();  // releases buffer leases before the answer goes out
        in_flight_.fetch_sub(1);
        env_.metrics->RpcFinished(rpc, static_cast<grpc::StatusCode>(status.raw_code()),
                                  SecondsSince(start), probe_set, timings.kernel_path);
        std::move(finish)(status);
      });
}

grpc::ServerUnaryReactor* ProbeSidecarService::Score(grpc::CallbackServerContext* context,
                                                     const v1::ScoreRequest* request,
                                                     v1::ScoreResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunScore(Rpc::kScore, request, response, [reactor](const absl::Status& status) {
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerBidiReactor<v1::ScoreRequest, v1::ScoreResponse>* ProbeSidecarService::ScoreStream(
    grpc::CallbackServerContext* /*context*/) {
  return new ScoreStreamReactor(this);
}

grpc::ServerUnaryReactor* ProbeSidecarService::Verify(grpc::CallbackServerContext* context,
                                                      const v1::VerifyRequest* /*request*/,
                                                      v1::VerifyResponse* /*response*/) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kVerify);
  return Answer(context, Rpc::kVerify, start,
                absl::UnimplementedError(
                    "Verify (MLA verify attention) is declared in API v1 but its kernel is not "
                    "part of this release; nothing was read or written"));
}

grpc::ServerUnaryReactor* ProbeSidecarService::ServerInfo(grpc::CallbackServerContext* context,
                                                          const v1::ServerInfoRequest* /*request*/,
                                                          v1::ServerInfoResponse* response) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(Rpc::kServerInfo);
  response->set_version(kVersion);
  response->set_git_commit(kGitCommit);
  response->set_backend(env_.executor->backend());
  response->set_device_name(env_.executor->device_name());
  response->set_device_id(env_.config.device);
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_message_bytes(env_.config.max_message_bytes);
  limits->set_max_concurrent_requests(env_.config.max_concurrent_requests);
  limits->set_max_rows(env_.config.max_rows);
  limits->set_max_probes(env_.config.max_probes);
  limits->set_max_probe_file_bytes(env_.config.max_probe_file_bytes);
  for (const std::shared_ptr<const ProbeSet>& set : env_.probes->List()) {
    FillProbeSetInfo(*set, response->add_probe_sets());
  }
  const GraphCacheCounters graphs = env_.executor->graph_cache();
  v1::GraphCacheStats* stats = response->mutable_graph_cache();
  stats->set_entries(graphs.entries);
  stats->set_capacity(graphs.capacity);
  stats->set_hits(graphs.hits);
  stats->set_misses(graphs.misses);
  stats->set_captures(graphs.captures);
  stats->set_evictions(graphs.evictions);
  response->set_uptime_seconds(SecondsSince(started_));
  if (BufferRegistry* buffers = env_.executor->buffers(); buffers != nullptr) {
    response->set_registered_buffers(static_cast<uint32_t>(buffers->counters().registrations));
  }
  {
    absl::MutexLock lock(&listening_mu_);
    for (const std::string& address : listening_) response->add_listen(address);
  }
  response->set_metrics_listen(env_.metrics_listening);
  response->set_cuda_runtime(kCudaRuntime);
  return Answer(context, Rpc::kServerInfo, start, absl::OkStatus());
}

}  // namespace probesidecar::server
