#include "server/rpc/server.h"

#include <grp.h>
#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/exposer.h"
#include "server/buffers/cuda_ipc.h"
#include "server/buffers/ipc_registries.h"
#include "server/config/version.h"
#include "server/executors/make_executor.h"
#include "server/observability/exposer_stop.h"
#include "server/observability/log.h"
#include "server/observability/metrics.h"
#include "server/observability/outcome_labels.h"
#include "server/probes/probe_registry.h"
#include "server/rpc/outcome_report.h"
#include "server/rpc/service.h"
#include "server/rpc/unix_listener.h"

namespace probesidecar::server {
namespace {

constexpr char kServiceName[] = "probesidecar.v1.ProbeSidecar";

// <directory of this executable>/../share/probe-sidecar/probes
std::string BundledProbesDir() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "";
  return (exe.parent_path().parent_path() / "share" / "probe-sidecar" / "probes").string();
}

LogLevel ParseLogLevel(const std::string& name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "warning") return LogLevel::kWarning;
  if (name == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

// The whole content of a file, or an error naming the flag.
absl::StatusOr<std::string> ReadFlagFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, "=", path, ": cannot open"));
  std::ostringstream content;
  content << in.rdbuf();
  if (content.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": empty"));
  }
  return content.str();
}

// TCP listeners: TLS (mutual with a client CA) when configured, else plaintext. Unix sockets are
// always plaintext (their file mode guards them).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const Config& config) {
  if (config.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = ReadFlagFile("tls-cert", config.tls_cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFlagFile("tls-key", config.tls_key_file);
  if (!key.ok()) return key.status();
  const bool mutual = !config.tls_client_ca_file.empty();
  grpc::SslServerCredentialsOptions options(
      mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (mutual) {
    absl::StatusOr<std::string> ca = ReadFlagFile("tls-client-ca", config.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

// The admin token: the first line of --admin-token-file, without surrounding white space.
absl::StatusOr<std::string> AdminToken(const Config& config) {
  if (config.admin_token_file.empty()) return std::string();
  absl::StatusOr<std::string> content = ReadFlagFile("admin-token-file", config.admin_token_file);
  if (!content.ok()) return content.status();
  const std::string token(absl::StripAsciiWhitespace(content->substr(0, content->find('\n'))));
  if (token.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("--admin-token-file=", config.admin_token_file,
                     ": the token (first line) must be at least 16 characters"));
  }
  return token;
}

// Loads the probes directory: a file that does not load is skipped, logged and counted (the
// count is returned) unless --strict-probes; a --probes directory that cannot be read fails the
// start (an error, already logged); the bundled directory only warns.
absl::StatusOr<uint64_t> LoadProbesAtStart(const Config& config, bool bundled,
                                           ProbeRegistry& probes) {
  absl::StatusOr<std::vector<absl::Status>> failed = probes.LoadDirectory(config.probe_precision);
  if (!failed.ok()) {
    if (!bundled) {
      LogError("cannot start: --probes %s: %s", probes.probes_dir(), failed.status().message());
      return failed.status();
    }
    LogWarning("bundled probe sets not loaded from %s: %s", probes.probes_dir(),
               failed.status().message());
    return 0;
  }
  for (const absl::Status& error : *failed) {
    LogError("%s%s", config.strict_probes ? "cannot start (--strict-probes): " : "skipped: ",
             error.message());
  }
  if (config.strict_probes && !failed->empty()) {
    return absl::FailedPreconditionError("--strict-probes: a probe set did not load");
  }
  return failed->size();
}

// --admin-unix-group as a gid: a group name, or a number; nullopt when not set.
absl::StatusOr<std::optional<gid_t>> AdminUnixGroup(const Config& config) {
  if (config.admin_unix_group.empty()) return std::optional<gid_t>();
  if (gid_t gid = 0; absl::SimpleAtoi(config.admin_unix_group, &gid)) return std::optional(gid);
  std::vector<char> buffer(16384);
  group entry{};
  group* found = nullptr;
  const int error =
      ::getgrnam_r(config.admin_unix_group.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (error != 0 || found == nullptr) {
    return absl::NotFoundError(absl::StrCat("--admin-unix-group=", config.admin_unix_group,
                                            ": no such group", error != 0 ? ": " : "",
                                            error != 0 ? strerror(error) : ""));
  }
  return std::optional(found->gr_gid);
}

std::string UnixPath(const std::string& address) {
  absl::string_view path = address;
  if (!absl::ConsumePrefix(&path, "unix:")) return "";
  absl::ConsumePrefix(&path, "//");
  return std::string(path);
}

// The exit status when the GPU's CUDA context was lost (a sticky CUDA error): the process must be
// restarted to use the GPU again.
constexpr int kExitDeviceLost = 3;

// Ends the process with `exit_code` at `at` unless it has ended by then: whatever shutdown waits
// for, an orchestrator that waits for the exit never sees a stuck process.
void StartExitWatchdog(absl::Time at, int exit_code) {
  std::thread([at, exit_code] {
    absl::SleepFor(at - absl::Now());
    LogError("shutdown did not finish in time: exiting now (status %d)", exit_code);
    std::fflush(nullptr);
    std::_Exit(exit_code);
  }).detach();
}

// The signals that start a shutdown; RunServer blocks them in every thread, Serve waits for them.
sigset_t ShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

// Starts the service, serves until SIGINT or SIGTERM (or until the executor can no longer serve:
// a lost CUDA context), drains and stops it; every gRPC object it made is gone when it returns.
// `*device_abandoned` is set when work was left pending on the device (the process must then end
// without the CUDA runtime's teardown, which could wait for it).
int Serve(const Config& config, ExecutorDecorator decorate, bool* device_abandoned) {
  const sigset_t signals = ShutdownSignals();

  CudaIpcOpener ipc_opener;
  // The sessions and the labels they declare on their outcome series (every backend), and their
  // buffers and events (a backend with devices).
  SessionTable sessions;
  OutcomeLabels outcome_labels(config.session_labels,
                               static_cast<int>(config.max_session_label_sets));
  std::unique_ptr<IpcRegistries> ipc;  // destroyed after the executor
  absl::StatusOr<std::unique_ptr<Executor>> made = MakeExecutor(config);
  if (!made.ok()) {
    LogError("cannot start: %s", made.status().message());
    return 1;
  }
  std::unique_ptr<Executor> executor = std::move(*made);
  if (decorate) executor = decorate(std::move(executor));
  // The service's sessions, buffers and events, on the executor's devices. Declared before the
  // executor's work can take leases and gone after the executor has stopped (a lease points into
  // the registries).
  if (const std::vector<int> devices = executor->devices(); !devices.empty()) {
    ipc =
        std::make_unique<IpcRegistries>(devices, &sessions, &ipc_opener,
                                        BufferRegistryLimits{4096, config.max_session_buffer_bytes,
                                                             config.allow_sessionless_buffers});
  }

  const bool bundled = config.probes_dir.empty();
  const std::string probes_dir = bundled ? BundledProbesDir() : config.probes_dir;
  ProbeSetLimits limits;
  limits.max_probes = static_cast<int32_t>(config.max_probes);
  limits.file.max_file_bytes = config.max_probe_file_bytes;
  limits.max_sets = config.max_probe_sets;
  limits.max_total_bytes = config.max_probe_set_bytes;
  ProbeRegistry probes(probes_dir, limits,
                       [&executor](ProbeSet& set) { return executor->PrepareProbeSet(set); });
  absl::StatusOr<uint64_t> probe_set_load_errors = LoadProbesAtStart(config, bundled, probes);
  if (!probe_set_load_errors.ok()) {
    executor->Shutdown();
    return 1;
  }
  std::vector<std::string> loaded;
  for (const auto& set : probes.List()) {
    // Start-up captures every set's graphs before serving (on the executor's workers).
    absl::Notification warm;
    executor->Warmup(set, [&warm, name = set->name](absl::Status status) {
      if (!status.ok()) LogWarning("warm-up of probe set '%s': %s", name, status.message());
      warm.Notify();
    });
    warm.WaitForNotification();
    loaded.push_back(
        absl::StrCat(set->name, " (", kernels::ProbePrecisionName(set->precision), ")"));
  }
  LogInfo("probe sets from %s: [%s]", probes_dir, absl::StrJoin(loaded, ", "));

  BuildInfo build{kVersion, kGitCommit, kCudaRuntime, executor->device_name(), executor->backend()};
  Metrics metrics(build, [&probes, &executor, &ipc, &outcome_labels, &config,
                          load_errors = *probe_set_load_errors] {
    MetricsState state;
    // What the probes found: a fresh copy of the device counters (the executor's device monitors
    // make it; a device that does not answer in time keeps its previous copy).
    executor->RefreshOutcomes(absl::Now() + absl::Milliseconds(500));
    state.session_labels = outcome_labels.keys();
    const std::vector<std::vector<std::string>> label_values = outcome_labels.Values();
    for (const std::shared_ptr<const ProbeSet>& set : probes.List()) {
      AppendOutcomeSeries(*set, executor->OutcomeCounts(*set), label_values,
                          config.max_probe_labels, &state.probe_outcomes);
    }
    state.probe_sets = probes.size();
    state.probe_set_load_errors = load_errors;
    state.graph_cache = executor->graph_cache();
    state.device_memory_bytes = executor->device_memory_bytes();
    state.queued_requests = executor->queued();
    state.queue_capacity = executor->queue_capacity();
    const DroppedRequests dropped = executor->dropped();
    state.expired_requests = dropped.expired;
    state.cancelled_requests = dropped.cancelled;
    state.invalid_device_rows = executor->invalid_device_rows();
    state.invalid_verify_requests = executor->invalid_verify_requests();
    state.non_finite_device_scores = executor->non_finite_device_scores();
    state.parked_slots = executor->parked_slots();
    state.mps = executor->mps();
    if (ipc != nullptr) {
      const BufferCounters counters = ipc->buffers.counters();
      state.registered_buffers = counters.registrations;
      state.registered_buffer_bytes = counters.registered_bytes;
      state.open_ipc_handles = counters.open_handles;
    }
    for (const DeviceReport& report : executor->device_reports()) {
      DeviceMetricsState& d = state.devices.emplace_back();
      d.device = absl::StrCat(report.device);
      d.up = report.failure.empty();
      d.memory_bytes = report.memory_bytes;
      d.parked_slots = report.parked_slots;
      d.graph_cache = report.graph_cache;
      if (ipc != nullptr) {
        const BufferCounters counters = ipc->buffers.counters(report.device);
        d.registered_buffers = counters.registrations;
        d.registered_buffer_bytes = counters.registered_bytes;
        d.open_ipc_handles = counters.open_handles;
      }
    }
    return state;
  });

  std::unique_ptr<prometheus::Exposer> exposer;
  std::string metrics_listening;
  if (config.metrics_listen != "none") {
    try {
      exposer = std::make_unique<prometheus::Exposer>(config.metrics_listen);
      exposer->RegisterCollectable(metrics.collectable());
      const std::vector<int> ports = exposer->GetListeningPorts();
      const std::string host = config.metrics_listen.substr(0, config.metrics_listen.rfind(':'));
      metrics_listening = absl::StrCat(host, ":", ports.empty() ? 0 : ports.front());
    } catch (const std::exception& e) {
      LogError("cannot start: metrics endpoint %s: %s", config.metrics_listen, e.what());
      executor->Shutdown();
      return 1;
    }
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes));
  // gRPC sets SO_REUSEPORT by default: a second sidecar would then share the port and silently
  // take half the traffic. A port in use must fail the start instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tcp_credentials = TcpCredentials(config);
  absl::StatusOr<std::string> admin_token = AdminToken(config);
  for (const absl::Status& s : {tcp_credentials.status(), admin_token.status()}) {
    if (!s.ok()) {
      LogError("cannot start: %s", s.message());
      executor->Shutdown();
      return 1;
    }
  }
  absl::StatusOr<std::optional<gid_t>> admin_unix_gid = AdminUnixGroup(config);
  if (!admin_unix_gid.ok()) {
    LogError("cannot start: %s", admin_unix_gid.status().message());
    executor->Shutdown();
    return 1;
  }
  // TCP listeners are gRPC's; Unix sockets are the service's own (unix_listener.h: it accepts
  // them itself to learn each peer's uid), created with --unix-socket-mode from the start.
  std::vector<int> ports(config.listen.size(), 0);
  std::vector<std::unique_ptr<UnixListener>> unix_listeners;
  for (size_t i = 0; i < config.listen.size(); ++i) {
    if (const std::string path = UnixPath(config.listen[i]); !path.empty()) {
      absl::StatusOr<std::unique_ptr<UnixListener>> listener =
          UnixListener::Listen(path, config.unix_socket_mode);
      if (!listener.ok()) {
        LogError("cannot start: could not listen on %s: %s", config.listen[i],
                 listener.status().message());
        unix_listeners.clear();
        executor->Shutdown();
        return 1;
      }
      unix_listeners.push_back(*std::move(listener));
      continue;
    }
    builder.AddListeningPort(config.listen[i], *tcp_credentials, &ports[i]);
  }
  UnixPeers unix_peers;

  ServiceEnv env;
  env.config = config;
  env.metrics_listening = metrics_listening;
  env.probes = &probes;
  env.executor = executor.get();
  env.sessions = &sessions;
  env.outcome_labels = &outcome_labels;
  env.ipc = ipc.get();
  env.metrics = &metrics;
  env.admin_token = *admin_token;
  env.admin_unix_gid = *admin_unix_gid;
  env.unix_peers = &unix_peers;
  env.server_uid = ::geteuid();
  ProbeSidecarService service(env);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    LogError("cannot start: could not listen on %s", absl::StrJoin(config.listen, ", "));
    unix_listeners.clear();
    executor->Shutdown();
    return 1;
  }
  for (const auto& listener : unix_listeners) listener->Start(server.get(), &unix_peers);
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  // A lost CUDA context: NOT_SERVING at once, then the drain a signal starts (every request fails
  // fast by then), and exit status 3 so that the supervisor restarts the server.
  struct Fatal {
    absl::Mutex mu;
    absl::Status why ABSL_GUARDED_BY(mu);
  };
  auto fatal = std::make_shared<Fatal>();
  executor->SetFatalHandler([fatal, health](const absl::Status& why) {
    {
      absl::MutexLock lock(&fatal->mu);
      fatal->why = why;
    }
    health->SetServingStatus(false);
    health->SetServingStatus(kServiceName, false);
    ::kill(::getpid(), SIGTERM);  // wakes the sigwait below
  });
  std::vector<std::string> listening;
  for (size_t i = 0; i < config.listen.size(); ++i) {
    const std::string& address = config.listen[i];
    if (absl::StartsWith(address, "unix:")) {
      listening.push_back(address);
    } else if (ports[i] == 0) {
      LogError("cannot start: could not listen on %s", address);
      unix_listeners.clear();
      server->Shutdown();
      executor->Shutdown();
      return 1;
    } else {
      listening.push_back(absl::StrCat(address.substr(0, address.rfind(':')), ":", ports[i]));
    }
  }
  service.SetListening(listening);
  // A listener other hosts can reach, in plaintext or without an admin credential, is allowed
  // but said out loud.
  for (const std::string& address : config.listen) {
    const bool loopback = absl::StartsWith(address, "unix:") || absl::StartsWith(address, "127.") ||
                          absl::StartsWith(address, "[::1]") ||
                          absl::StartsWith(address, "localhost:");
    if (loopback) continue;
    // (Without an admin credential, TCP clients are never admin: nothing more to say.)
    if (config.tls_cert_file.empty()) {
      LogWarning("%s is reachable from other hosts in plaintext (no --tls-cert)", address);
    }
  }

  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  LogInfo("probe-sidecar %s (%s) serving on %s; metrics on %s; backend %s (%s)", kVersion,
          kGitCommit, absl::StrJoin(listening, ", "),
          metrics_listening.empty() ? "off" : metrics_listening, executor->backend(),
          executor->device_name());

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  int exit_code = 0;
  absl::Status lost;
  {
    absl::MutexLock lock(&fatal->mu);
    lost = fatal->why;
  }
  if (!lost.ok()) {
    exit_code = kExitDeviceLost;
    LogError("stopping (exit status %d): %s", exit_code, lost.message());
  } else {
    LogInfo("%s: draining in-flight requests (up to %.1f s)", strsignal(signal_number),
            config.shutdown_grace_seconds);
  }
  health->SetServingStatus(false);
  health->SetServingStatus(kServiceName, false);
  // New work is refused with UNAVAILABLE (retryable) while the work in progress finishes; only
  // then does gRPC shut down, so no admitted request is cut off before the grace period ends.
  const absl::Time deadline =
      absl::Now() + absl::Microseconds(static_cast<int64_t>(config.shutdown_grace_seconds * 1e6));
  // The process is gone within the grace period plus 1 s, as docs/reliability.md promises, with
  // room for its exit itself.
  StartExitWatchdog(deadline + absl::Milliseconds(600), exit_code);
  service.BeginDrain();
  if (!service.WaitUntilIdle(deadline)) {
    LogWarning("grace period over with requests still in progress: cancelling them");
  }
  // Requests already on the wire when gRPC shuts down are cancelled by it; a short window in
  // which they are refused with UNAVAILABLE instead lets clients retry elsewhere cleanly.
  absl::SleepFor(
      std::min(absl::Milliseconds(200), std::max(absl::ZeroDuration(), deadline - absl::Now())));
  // The service's own work is done (or out of time). What can still hold gRPC's shutdown is not
  // ours to wait for: gRPC's health service keeps Watch streams open, and a client may keep its
  // connection after GOAWAY. Either would hold the process for the rest of the grace period: they
  // get a short moment to end cleanly, then gRPC cancels them. Cancelled calls whose work is still
  // queued or running are skipped or stopped early by the executor, so this returns promptly.
  // No new Unix-socket connection is handed to gRPC from here on (and the socket files go).
  for (const auto& listener : unix_listeners) listener->Stop();
  server->Shutdown(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Milliseconds(100))));
  server->Wait();
  service.StopControlWorker();  // releases of ended sessions (the IPC registries outlive it)
  // Every call is answered; what the GPU still runs is ms away, unless a stream waits for a
  // client's event that never comes: that is not waited for past a short moment.
  // (The metrics endpoint stops first: a scrape reads the executor's slots.)
  StopExposer(std::move(exposer),
              config.metrics_listen.substr(0, config.metrics_listen.rfind(':')));
  const absl::Time now = absl::Now();
  const bool clean = executor->ShutdownBy(
      std::max(now + absl::Milliseconds(50), std::min(deadline, now + absl::Milliseconds(500))));
  executor->SetFatalHandler({});
  {
    absl::MutexLock lock(&fatal->mu);
    if (!fatal->why.ok()) exit_code = kExitDeviceLost;  // also when it was lost while stopping
  }
  if (!clean) {
    // Its device memory, streams and IPC mappings stay as they are: freeing them could wait for
    // the pending work. The process's exit reclaims them.
    *device_abandoned = true;
    executor.release();  // NOLINT(bugprone-unused-return-value): left to the exit
    ipc.release();       // NOLINT(bugprone-unused-return-value): its mappings too
  }
  LogInfo("stopped");
  return exit_code;
}

// How long the process waits for gRPC's own library shutdown once the service has stopped.
constexpr absl::Duration kGrpcLibraryShutdownWait = absl::Milliseconds(300);

// Drops the process's last reference to the gRPC library (taken in RunServer) and returns, or,
// when gRPC's shutdown does not finish within kGrpcLibraryShutdownWait, ends the process with
// `exit_code` without waiting for it.
//
// Why: the last grpc_shutdown() joins gRPC's executor threads, and in gRPC 1.51 one of them may
// be the TCP backup poller (src/core/lib/iomgr/tcp_posix.cc). On a polling engine that does not
// poll in the background (epoll1, Linux's), a write to a client's socket that would block
// (EAGAIN: e.g. a 1 MiB Score response the client has not read yet) starts that poller on an
// executor thread, in epoll_wait with a 10 s deadline. When the write completes nothing wakes it,
// so it sleeps out the rest of its 10 s, and the join would wait with it: the process would exit
// up to 10 s after logging "stopped". At this point the service has stopped (no listener, no
// call, no work, sockets removed): nothing is lost by leaving the rest to the kernel.
void ReleaseGrpcLibrary(int exit_code) {
  const absl::Time start = absl::Now();
  auto done = std::make_shared<absl::Notification>();
  std::thread shutdown([done] {
    grpc_shutdown();
    done->Notify();
  });
  if (done->WaitForNotificationWithTimeout(kGrpcLibraryShutdownWait)) {
    shutdown.join();
    LogDebug("gRPC library shut down in %.3f s", absl::ToDoubleSeconds(absl::Now() - start));
    return;
  }
  LogInfo(
      "gRPC's library shutdown is still waiting for its TCP backup poller (gRPC 1.51 lets it "
      "sleep up to 10 s after a blocked write); exiting without it");
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

}  // namespace

int RunServer(const Config& config, ExecutorDecorator decorate) {
  // Blocked before any thread exists (grpc_init below starts gRPC's own), so that every thread
  // inherits the mask and SIGINT/SIGTERM reach only Serve's sigwait: a thread that did not block
  // them would take the signal's default action and kill the process without draining.
  const sigset_t signals = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  SetLogLevel(ParseLogLevel(config.log_level));
  // This reference outlives every gRPC object Serve makes, so that the library's final shutdown
  // happens here, with a bound (ReleaseGrpcLibrary), and not in the destructor of whichever of
  // them goes last.
  grpc_init();
  bool device_abandoned = false;
  const int exit_code = Serve(config, std::move(decorate), &device_abandoned);
  if (device_abandoned) {
    // Neither gRPC's library shutdown nor the CUDA runtime's teardown at exit: the device still
    // has work of ours pending (or a lost context), and both could wait for it.
    std::fflush(nullptr);
    std::_Exit(exit_code);
  }
  ReleaseGrpcLibrary(exit_code);
  return exit_code;
}

int ServerMain(int argc, char** argv, ExecutorDecorator decorate) {
  absl::StatusOr<ParsedFlags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "probe-sidecar: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (parsed->show_help) {
    std::fputs(HelpText().c_str(), stdout);
    return 0;
  }
  if (parsed->show_version) {
    std::printf("probe-sidecar %s (git %s, CUDA runtime %s)\n", kVersion, kGitCommit, kCudaRuntime);
    return 0;
  }
  return RunServer(parsed->config, std::move(decorate));
}

}  // namespace probesidecar::server
