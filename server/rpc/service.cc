#include "server/rpc/service.h"

#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/buffers/buffer_registry.h"
#include "server/config/version.h"
#include "server/observability/log.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/rpc_helpers.h"

namespace probesidecar::server {
namespace {

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

// Administrative work waiting for the control worker; past this, such RPCs are refused.
constexpr size_t kControlQueue = 1024;

// Equal strings, in time that depends only on their lengths (the admin token).
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// gRPC's peer strings: "unix:...", "ipv4:127.0.0.1:port", "ipv6:[::1]:port" (or %5B::1%5D).
bool IsLocalPeer(absl::string_view peer) {
  return absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "ipv4:127.") ||
         absl::StartsWith(peer, "ipv6:[::1]") || absl::StartsWith(peer, "ipv6:%5B::1%5D") ||
         absl::StartsWith(peer, "ipv6:[::ffff:127.") ||
         absl::StartsWith(peer, "ipv6:%5B::ffff:127.");
}

std::string QuotePeer(absl::string_view peer) { return absl::StrCat("'", peer.substr(0, 80), "'"); }

}  // namespace

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
  info->set_precision(ToProtoPrecision(set.precision));
}

ProbeSidecarService::ProbeSidecarService(ServiceEnv env)
    : env_(std::move(env)), started_(Clock::now()), control_(1, kControlQueue) {}

ProbeSidecarService::~ProbeSidecarService() { StopControlWorker(); }

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

void ProbeSidecarService::StopControlWorker() { control_.Shutdown(); }

bool ProbeSidecarService::IsAdminPeer(const UnixPeer& peer) const {
  // The server's own user and root, unless an admin credential (token, TLS identity) says who is
  // admin; --admin-unix-group's members always.
  const bool credential = !env_.admin_token.empty() || !env_.config.admin_tls_identity.empty();
  if (!credential && (peer.uid == env_.server_uid || peer.uid == 0)) return true;
  return env_.admin_unix_gid.has_value() && peer.InGroup(*env_.admin_unix_gid);
}

absl::Status ProbeSidecarService::AuthorizeAdmin(grpc::CallbackServerContext* context) const {
  const std::string& token = env_.admin_token;
  const std::string& identity = env_.config.admin_tls_identity;
  const std::string peer_name = context->peer();
  const std::optional<UnixPeer> unix_peer =
      env_.unix_peers != nullptr ? env_.unix_peers->Find(peer_name) : std::nullopt;
  if (unix_peer.has_value() && IsAdminPeer(*unix_peer)) return absl::OkStatus();
  if (token.empty() && identity.empty()) {
    // No admin credential: the Unix socket's peer credentials decide, and TCP is never admin.
    const std::string allowed = absl::StrCat(
        "only the server's own user (uid ", env_.server_uid, ") and root",
        env_.admin_unix_gid.has_value()
            ? absl::StrCat(", or members of group ", *env_.admin_unix_gid, " (--admin-unix-group),")
            : "",
        " may load and unload probe sets, over the Unix socket");
    const std::string more =
        "; start the server with --admin-token-file (a token sent as metadata 'authorization: "
        "Bearer <token>'), --admin-tls-identity (a mutual-TLS client certificate) or "
        "--admin-unix-group (a group of local users) to allow more";
    if (!unix_peer.has_value()) {
      return absl::PermissionDeniedError(absl::StrCat("with no admin credential configured, ",
                                                      allowed, "; this call came from ",
                                                      QuotePeer(peer_name), more));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("with no admin credential configured, ", allowed, "; this call came from uid ",
                     unix_peer->uid, " (pid ", unix_peer->pid, ")", more));
  }
  bool presented = false;
  if (!token.empty()) {
    const auto& metadata = context->client_metadata();
    if (auto it = metadata.find("authorization"); it != metadata.end()) {
      presented = true;
      const std::string given(it->second.data(), it->second.size());
      if (ConstantTimeEquals(given, absl::StrCat("Bearer ", token))) return absl::OkStatus();
    }
  }
  if (!identity.empty()) {
    std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
    if (auth != nullptr && auth->IsPeerAuthenticated()) {
      presented = true;
      for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
        if (std::string(name.data(), name.size()) == identity) return absl::OkStatus();
      }
    }
  }
  if (!presented) {
    return absl::UnauthenticatedError(absl::StrCat(
        "loading and unloading probe sets needs the admin token (metadata 'authorization: Bearer "
        "<token>') or the admin's TLS client certificate",
        env_.admin_unix_gid.has_value() ? ", or a Unix-socket client in --admin-unix-group" : ""));
  }
  return absl::PermissionDeniedError("these credentials may not load or unload probe sets");
}

absl::Status ProbeSidecarService::CheckLocalPeer(grpc::CallbackServerContext* context) const {
  if (env_.config.allow_remote_ipc) return absl::OkStatus();
  const std::string peer = context->peer();
  if (IsLocalPeer(peer)) return absl::OkStatus();
  if (env_.unix_peers != nullptr && env_.unix_peers->Find(peer).has_value()) {
    return absl::OkStatus();  // the Unix socket
  }
  return absl::PermissionDeniedError(
      absl::StrCat("CUDA IPC registrations are accepted from this host only (Unix socket or "
                   "loopback), not from ",
                   QuotePeer(peer), "; start the server with --allow-remote-ipc to accept them"));
}

absl::Status ProbeSidecarService::Draining() const {
  if (!draining_.load()) return absl::OkStatus();
  return absl::UnavailableError("the server is shutting down");
}

void ProbeSidecarService::SetListening(std::vector<std::string> listening) {
  absl::MutexLock lock(&listening_mu_);
  listening_ = std::move(listening);
}

grpc::ServerUnaryReactor* ProbeSidecarService::Answer(grpc::CallbackServerContext* context, Rpc rpc,
                                                      Clock::time_point start,
                                                      const absl::Status& status) {
  env_.metrics->RpcFinished(rpc, status.code(), SecondsSince(start), "", "");
  if (!status.ok() && status.code() != absl::StatusCode::kNotFound) {
    LogDebug("%s: %s", RpcName(rpc), status.ToString());
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* ProbeSidecarService::Refuse(grpc::CallbackServerContext* context, Rpc rpc,
                                                      const absl::Status& status) {
  env_.metrics->RpcStarted(rpc);
  return Answer(context, rpc, Clock::now(), status);
}

void ProbeSidecarService::RunOnControlWorker(absl::AnyInvocable<void() &&> work) {
  control_.Submit([work = std::move(work)](int) mutable { std::move(work)(); });
}

void ProbeSidecarService::RunOnControlWorker(Rpc rpc, bool refuse_while_draining, Finish finish,
                                             ControlWork work) {
  const Clock::time_point start = Clock::now();
  // Records the answer once, on whichever thread the work finishes.
  Finish answer = [this, rpc, start,
                   finish = std::move(finish)](const absl::Status& status) mutable {
    env_.metrics->RpcFinished(rpc, status.code(), SecondsSince(start), "", "");
    if (!status.ok() && status.code() != absl::StatusCode::kNotFound) {
      LogDebug("%s: %s", RpcName(rpc), status.ToString());
    }
    std::move(finish)(status);
    in_flight_.fetch_sub(1);
  };
  in_flight_.fetch_add(1);
  if (absl::Status draining = Draining(); refuse_while_draining && !draining.ok()) {
    std::move(answer)(draining);
    return;
  }
  control_.Submit([answer = std::move(answer), work = std::move(work)](int worker) mutable {
    if (worker == WorkerPool::kRefused) {
      std::move(answer)(absl::ResourceExhaustedError(absl::StrCat(
          "too many administrative requests are waiting (", kControlQueue, "); retry later")));
      return;
    }
    std::move(work)(std::move(answer));
  });
}

grpc::ServerUnaryReactor* ProbeSidecarService::AnswerFromControlWorker(
    grpc::CallbackServerContext* context, Rpc rpc, bool refuse_while_draining, ControlWork work) {
  env_.metrics->RpcStarted(rpc);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunOnControlWorker(
      rpc, refuse_while_draining,
      [reactor](const absl::Status& status) { reactor->Finish(ToGrpcStatus(status)); },
      std::move(work));
  return reactor;
}

grpc::ServerUnaryReactor* ProbeSidecarService::RegisterBuffer(
    grpc::CallbackServerContext* context, const v1::RegisterBufferRequest* request,
    v1::RegisterBufferResponse* response) {
  if (absl::Status local = CheckLocalPeer(context); !local.ok()) {
    return Refuse(context, Rpc::kRegisterBuffer, local);
  }
  BufferRegistry* buffers = env_.executor->buffers();
  if (buffers == nullptr) {
    return Refuse(context, Rpc::kRegisterBuffer, NoBuffersOnThisBackend(env_.executor->backend()));
  }
  // Opening an allocation (cudaIpcOpenMemHandle, 60-150 µs) is driver work: not on a gRPC thread.
  return AnswerFromControlWorker(
      context, Rpc::kRegisterBuffer, /*refuse_while_draining=*/true,
      [buffers, request, response](Finish finish) {
        absl::StatusOr<v1::RegisterBufferResponse> registered = buffers->Register(*request);
        if (registered.ok()) {
          *response = std::move(*registered);
          LogInfo(
              "registered buffer %d '%s': %d bytes at offset %d of a %d-byte allocation%s (pid "
              "%d)",
              response->buffer_id(), request->name(), request->byte_size(), request->offset_bytes(),
              response->allocation_bytes(), response->shared_mapping() ? " (shared mapping)" : "",
              request->client_pid());
        }
        std::move(finish)(registered.status());
      });
}

grpc::ServerUnaryReactor* ProbeSidecarService::UnregisterBuffer(
    grpc::CallbackServerContext* context, const v1::UnregisterBufferRequest* request,
    v1::UnregisterBufferResponse* response) {
  BufferRegistry* buffers = env_.executor->buffers();
  if (buffers == nullptr) {
    return Refuse(context, Rpc::kUnregisterBuffer,
                  NoBuffersOnThisBackend(env_.executor->backend()));
  }
  // Closing an allocation (cudaIpcCloseMemHandle) is driver work: not on a gRPC thread.
  return AnswerFromControlWorker(context, Rpc::kUnregisterBuffer, /*refuse_while_draining=*/false,
                                 [buffers, request, response](Finish finish) {
                                   absl::StatusOr<bool> deferred = buffers->Unregister(
                                       request->buffer_id(), request->session_id());
                                   if (deferred.ok()) {
                                     response->set_deferred(*deferred);
                                     LogInfo("unregistered buffer %d%s", request->buffer_id(),
                                             *deferred ? " (closes when its requests finish)" : "");
                                   }
                                   std::move(finish)(deferred.status());
                                 });
}

grpc::ServerUnaryReactor* ProbeSidecarService::RegisterEvent(
    grpc::CallbackServerContext* context, const v1::RegisterEventRequest* request,
    v1::RegisterEventResponse* response) {
  if (absl::Status local = CheckLocalPeer(context); !local.ok()) {
    return Refuse(context, Rpc::kRegisterEvent, local);
  }
  BufferRegistry* buffers = env_.executor->buffers();
  if (buffers == nullptr) {
    return Refuse(context, Rpc::kRegisterEvent, NoBuffersOnThisBackend(env_.executor->backend()));
  }
  // cudaIpcOpenEventHandle is driver work: not on a gRPC thread.
  return AnswerFromControlWorker(context, Rpc::kRegisterEvent, /*refuse_while_draining=*/true,
                                 [buffers, request, response](Finish finish) {
                                   absl::StatusOr<uint64_t> id = buffers->RegisterEvent(*request);
                                   if (id.ok()) {
                                     response->set_event_id(*id);
                                     LogDebug("registered event %d '%s' (session %d)", *id,
                                              request->name(), request->session_id());
                                   }
                                   std::move(finish)(id.status());
                                 });
}

grpc::ServerUnaryReactor* ProbeSidecarService::UnregisterEvent(
    grpc::CallbackServerContext* context, const v1::UnregisterEventRequest* request,
    v1::UnregisterEventResponse* /*response*/) {
  BufferRegistry* buffers = env_.executor->buffers();
  if (buffers == nullptr) {
    return Refuse(context, Rpc::kUnregisterEvent, NoBuffersOnThisBackend(env_.executor->backend()));
  }
  return AnswerFromControlWorker(
      context, Rpc::kUnregisterEvent, /*refuse_while_draining=*/false,
      [buffers, request](Finish finish) {
        std::move(finish)(buffers->UnregisterEvent(request->event_id(), request->session_id()));
      });
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

grpc::ServerUnaryReactor* ProbeSidecarService::LoadProbeSet(grpc::CallbackServerContext* context,
                                                            const v1::LoadProbeSetRequest* request,
                                                            v1::LoadProbeSetResponse* response) {
  if (absl::Status admin = AuthorizeAdmin(context); !admin.ok()) {
    return Refuse(context, Rpc::kLoadProbeSet, admin);
  }
  // Checked here, before any work: a bad value loads nothing.
  absl::StatusOr<kernels::ProbePrecisionRequest> precision =
      FromProtoPrecision(request->precision());
  if (!precision.ok()) return Refuse(context, Rpc::kLoadProbeSet, precision.status());
  // Reading the file, uploading the weights and capturing graphs all wait (disk, device): the
  // control worker loads, the executor's workers capture, and the last of them answers.
  return AnswerFromControlWorker(
      context, Rpc::kLoadProbeSet, /*refuse_while_draining=*/true,
      [this, request, response, precision = *precision](Finish finish) {
        absl::StatusOr<std::shared_ptr<const ProbeSet>> loaded;
        switch (request->source_case()) {
          case v1::LoadProbeSetRequest::kPath:
            loaded = env_.probes->LoadFromPath(request->name(), request->path(), request->replace(),
                                               precision);
            break;
          case v1::LoadProbeSetRequest::kSafetensors:
            loaded = env_.probes->LoadFromBytes(request->name(), request->safetensors(),
                                                request->replace(), precision);
            break;
          case v1::LoadProbeSetRequest::SOURCE_NOT_SET:
            loaded = absl::InvalidArgumentError(
                "LoadProbeSet needs a source: a server path or the safetensors bytes");
            break;
        }
        if (!loaded.ok()) {
          std::move(finish)(loaded.status());
          return;
        }
        std::shared_ptr<const ProbeSet> set = std::move(*loaded);
        FillProbeSetInfo(*set, response->mutable_probe_set());
        LogInfo("loaded probe set '%s': P=%d H=%d %s from %s", set->name, set->num_probes,
                set->hidden, kernels::ProbePrecisionName(set->precision), set->source);
        env_.executor->Warmup(
            set, [name = set->name, finish = std::move(finish)](absl::Status status) mutable {
              // The set is loaded either way: a failed warm-up only means first requests capture.
              if (!status.ok()) LogWarning("warm-up of probe set '%s': %s", name, status.message());
              std::move(finish)(absl::OkStatus());
            });
      });
}

grpc::ServerUnaryReactor* ProbeSidecarService::UnloadProbeSet(
    grpc::CallbackServerContext* context, const v1::UnloadProbeSetRequest* request,
    v1::UnloadProbeSetResponse* /*response*/) {
  if (absl::Status admin = AuthorizeAdmin(context); !admin.ok()) {
    return Refuse(context, Rpc::kUnloadProbeSet, admin);
  }
  return AnswerFromControlWorker(context, Rpc::kUnloadProbeSet, /*refuse_while_draining=*/false,
                                 [this, request](Finish finish) {
                                   absl::Status status = env_.probes->Unload(request->name());
                                   if (status.ok())
                                     LogInfo("unloaded probe set '%s'", request->name());
                                   std::move(finish)(status);
                                 });
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
  limits->set_max_queued_requests(env_.config.max_queued_requests);
  limits->set_max_probe_sets(env_.config.max_probe_sets);
  limits->set_max_probe_set_bytes(env_.config.max_probe_set_bytes);
  limits->set_max_session_buffer_bytes(env_.config.max_session_buffer_bytes);
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
  response->set_mps(env_.executor->mps());
  response->set_queued_requests(env_.executor->queued());
  response->set_gpu_requests(env_.executor->gpu_requests());
  return Answer(context, Rpc::kServerInfo, start, absl::OkStatus());
}

}  // namespace probesidecar::server
