#include "server/rpc/server.h"

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/exposer.h"
#include "server/ipc/cuda_ipc.h"
#include "server/ipc/ipc_registries.h"
#include "server/config/version.h"
#include "server/executors/make_executor.h"
#include "server/observability/exposer_stop.h"
#include "server/observability/log.h"
#include "server/observability/metrics.h"
#include "server/observability/outcome_labels.h"
#include "server/probes/probe_registry.h"
#include "server/rpc/metrics_sources.h"
#include "server/rpc/server_start.h"
#include "server/rpc/shutdown_signal.h"
#include "server/rpc/service.h"

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

// Loads the probes directory: a file that does not load is skipped, logged and counted (the
// count is returned) unless --strict-probes; a --probes directory that cannot be read fails the
// start (an error, already logged); the bundled directory only warns.
absl::StatusOr<uint64_t> LoadProbesAtStart(const Config& config, bool bundled,
                                           ProbeRegistry& probes) {
  absl::StatusOr<std::vector<absl::Status>> failed =
      probes.LoadDirectory(ProbeSetOptions(config.probe_precision, config.count_outcomes));
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

// Loads the probe sets and captures every set's graphs before serving (on the executor's
// workers); returns the probe-set load errors to count, or an error (already logged).
absl::StatusOr<uint64_t> LoadAndWarmProbeSets(const Config& config, bool bundled,
                                              ProbeRegistry& probes, Executor& executor) {
  absl::StatusOr<uint64_t> load_errors = LoadProbesAtStart(config, bundled, probes);
  if (!load_errors.ok()) return load_errors.status();
  std::vector<std::string> loaded;
  for (const auto& set : probes.List()) {
    absl::Notification warm;
    executor.Warmup(set, [&warm, name = set->name](absl::Status status) {
      if (!status.ok()) LogWarning("warm-up of probe set '%s': %s", name, status.message());
      warm.Notify();
    });
    warm.WaitForNotification();
    loaded.push_back(
        absl::StrCat(set->name, " (", kernels::ProbePrecisionName(set->precision), ")"));
  }
  LogInfo("probe sets from %s: [%s]", probes.probes_dir(), absl::StrJoin(loaded, ", "));
  return load_errors;
}

// Why the service stops by itself: a lost CUDA context (set by the executor's fatal handler).
struct FatalState {
  absl::Mutex mu;
  absl::Status why ABSL_GUARDED_BY(mu);

  absl::Status Why() {
    absl::MutexLock lock(&mu);
    return why;
  }
};

// A lost CUDA context: NOT_SERVING at once, then the drain a signal starts (every request fails
// fast by then), and exit status 3 so that the supervisor restarts the server.
void StopOnFatalError(Executor& executor, grpc::HealthCheckServiceInterface* health,
                      std::shared_ptr<FatalState> fatal) {
  executor.SetFatalHandler([fatal, health](const absl::Status& why) {
    {
      absl::MutexLock lock(&fatal->mu);
      fatal->why = why;
    }
    health->SetServingStatus(false);
    health->SetServingStatus(kServiceName, false);
    ::kill(::getpid(), SIGTERM);  // wakes the sigwait in Serve
  });
}

void SetServing(grpc::HealthCheckServiceInterface* health, bool serving) {
  health->SetServingStatus(serving);
  health->SetServingStatus(kServiceName, serving);
}

int CannotStart(const absl::Status& why) {
  LogError("cannot start: %s", why.message());
  return 1;
}

// The service's buffers and events, on the executor's devices; none for a backend without
// devices (the CPU backend takes inline tensors only).
std::unique_ptr<IpcRegistries> MakeIpcRegistries(const Config& config, const Executor& executor,
                                                 SessionTable* sessions, CudaIpcOpener* opener) {
  const std::vector<int>& devices = executor.info().devices;
  if (devices.empty()) return nullptr;
  return std::make_unique<IpcRegistries>(
      devices, sessions, opener,
      BufferRegistryLimits{4096, config.max_session_buffer_bytes,
                           config.allow_sessionless_buffers});
}

ProbeSetLimits ProbeLimits(const Config& config) {
  ProbeSetLimits limits;
  limits.max_probes = static_cast<int32_t>(config.max_probes);
  limits.file.max_file_bytes = config.max_probe_file_bytes;
  limits.max_sets = config.max_probe_sets;
  limits.max_total_bytes = config.max_probe_set_bytes;
  return limits;
}

// gRPC's options for every listener: message sizes, the health and reflection services, and no
// shared ports (gRPC sets SO_REUSEPORT by default: a second sidecar would then share the port and
// silently take half the traffic; a port in use must fail the start instead).
void ConfigureBuilder(const Config& config, grpc::ServerBuilder& builder) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

// Starts gRPC with `service` and hands it the Unix-socket connections; the bound addresses, or
// an error (then nothing of it is left running).
absl::StatusOr<std::vector<std::string>> StartGrpc(const Config& config,
                                                   grpc::ServerBuilder& builder,
                                                   ProbeSidecarService& service,
                                                   Listeners& listeners, UnixPeers& unix_peers,
                                                   std::unique_ptr<grpc::Server>* server) {
  builder.RegisterService(&service);
  *server = builder.BuildAndStart();
  if (*server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", absl::StrJoin(config.listen, ", ")));
  }
  for (const auto& listener : listeners.unix_sockets) listener->Start(server->get(), &unix_peers);
  absl::StatusOr<std::vector<std::string>> listening = BoundAddresses(config, listeners.ports);
  if (!listening.ok()) {
    listeners.unix_sockets.clear();
    (*server)->Shutdown();
  }
  return listening;
}

// What a serving server is made of, for its drain (references into Serve's frame).
struct Running {
  const Config& config;
  ProbeSidecarService& service;
  grpc::Server& server;
  Listeners& listeners;
  MetricsEndpoint& endpoint;
  std::unique_ptr<Executor>& executor;
  std::unique_ptr<IpcRegistries>& ipc;  // destroyed after the executor
  grpc::HealthCheckServiceInterface* health;
  std::shared_ptr<FatalState> fatal;
};

// After the signal (or a lost CUDA context): NOT_SERVING, the drain of the work in progress up to
// the grace period, gRPC's shutdown, then the control worker, the metrics endpoint and the
// executor, in that order. Returns the exit code.
int DrainAndStop(Running r, const ShutdownSignal& signal, bool* device_abandoned) {
  int exit_code = 0;
  if (const absl::Status lost = r.fatal->Why(); !lost.ok()) {
    exit_code = kExitDeviceLost;
    LogError("stopping (exit status %d): %s", exit_code, lost.message());
  } else {
    LogInfo("%s: draining in-flight requests (up to %.1f s)",
            DescribeShutdownSignal(signal, ::getpid(), ProcessName(signal.pid)),
            r.config.shutdown_grace_seconds);
  }
  SetServing(r.health, false);
  // New work is refused with UNAVAILABLE (retryable) while the work in progress finishes; only
  // then does gRPC shut down, so no admitted request is cut off before the grace period ends.
  const absl::Time deadline =
      absl::Now() + absl::Microseconds(static_cast<int64_t>(r.config.shutdown_grace_seconds * 1e6));
  // The process is gone within the grace period plus 1 s, as docs/reliability.md promises, with
  // room for its exit itself.
  StartExitWatchdog(deadline + absl::Milliseconds(600), exit_code);
  r.service.BeginDrain();
  if (!r.service.WaitUntilIdle(deadline)) {
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
  for (const auto& listener : r.listeners.unix_sockets) listener->Stop();
  r.server.Shutdown(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Milliseconds(100))));
  r.server.Wait();
  r.service.StopControlWorker();  // releases of ended sessions (the IPC registries outlive it)
  // Every call is answered; what the GPU still runs is ms away, unless a stream waits for a
  // client's event that never comes: that is not waited for past a short moment.
  // (The metrics endpoint stops first: a scrape reads the executor's slots.)
  StopExposer(std::move(r.endpoint.exposer),
              r.config.metrics_listen.substr(0, r.config.metrics_listen.rfind(':')));
  const absl::Time now = absl::Now();
  const bool clean = r.executor->ShutdownBy(
      std::max(now + absl::Milliseconds(50), std::min(deadline, now + absl::Milliseconds(500))));
  r.executor->SetFatalHandler({});
  if (!r.fatal->Why().ok()) exit_code = kExitDeviceLost;  // also when it was lost while stopping
  if (!clean) {
    // Its device memory, streams and IPC mappings stay as they are: freeing them could wait for
    // the pending work. The process's exit reclaims them.
    *device_abandoned = true;
    r.executor.release();  // NOLINT(bugprone-unused-return-value): left to the exit
    r.ipc.release();       // NOLINT(bugprone-unused-return-value): its mappings too
  }
  LogInfo("stopped");
  return exit_code;
}

// Starts the service, serves until SIGINT or SIGTERM (or until the executor can no longer serve:
// a lost CUDA context), drains and stops it; every gRPC object it made is gone when it returns.
// `*device_abandoned` is set when work was left pending on the device (the process must then end
// without the CUDA runtime's teardown, which could wait for it). Each step that fails logs why
// and returns 1; from the executor's start on, one guard stops it on every such return.
int Serve(const Config& config, ExecutorDecorator decorate, bool* device_abandoned) {
  const sigset_t signals = ShutdownSignals();
  absl::StatusOr<StartInputs> inputs = ReadStartInputs(config);
  if (!inputs.ok()) return CannotStart(inputs.status());

  CudaIpcOpener ipc_opener;
  // The sessions and the labels they declare on their outcome series (every backend), and their
  // buffers and events (a backend with devices).
  SessionTable sessions;
  OutcomeLabels outcome_labels(config.session_labels,
                               static_cast<int>(config.max_session_label_sets));
  std::unique_ptr<IpcRegistries> ipc;  // destroyed after the executor
  absl::StatusOr<std::unique_ptr<Executor>> made = MakeExecutor(config);
  if (!made.ok()) return CannotStart(made.status());
  std::unique_ptr<Executor> executor = std::move(*made);
  if (decorate) executor = decorate(std::move(executor));
  auto stop_executor = absl::MakeCleanup([&executor] { executor->Shutdown(); });
  // Made before the executor's work can take leases and gone after the executor has stopped (a
  // lease points into the registries).
  ipc = MakeIpcRegistries(config, *executor, &sessions, &ipc_opener);

  const bool bundled = config.probes_dir.empty();
  ProbeRegistry probes(bundled ? BundledProbesDir() : config.probes_dir, ProbeLimits(config),
                       [&executor](ProbeSet& set) { return executor->Place(set); });
  absl::StatusOr<uint64_t> load_errors = LoadAndWarmProbeSets(config, bundled, probes, *executor);
  if (!load_errors.ok()) return 1;  // logged

  const MetricsSources sources{&config,   &probes,         executor.get(),
                               ipc.get(), &outcome_labels, *load_errors};
  Metrics metrics(
      BuildInfo{kVersion, kGitCommit, kCudaRuntime, executor->info().device_name,
                executor->info().backend},
      [sources] { return CollectMetricsState(sources); });
  absl::StatusOr<MetricsEndpoint> endpoint = StartMetricsEndpoint(config, metrics);
  if (!endpoint.ok()) return CannotStart(endpoint.status());

  grpc::ServerBuilder builder;
  ConfigureBuilder(config, builder);
  absl::StatusOr<Listeners> listeners = OpenListeners(config, inputs->tcp_credentials, builder);
  if (!listeners.ok()) return CannotStart(listeners.status());
  UnixPeers unix_peers;

  ServiceEnv env;
  env.config = config;
  env.metrics_listening = endpoint->listening;
  env.probes = &probes;
  env.executor = executor.get();
  env.sessions = &sessions;
  env.outcome_labels = &outcome_labels;
  env.ipc = ipc.get();
  env.metrics = &metrics;
  env.admin_token = inputs->admin_token;
  env.admin_unix_gid = inputs->admin_unix_gid;
  env.unix_peers = &unix_peers;
  env.server_uid = ::geteuid();
  ProbeSidecarService service(env);
  std::unique_ptr<grpc::Server> server;
  absl::StatusOr<std::vector<std::string>> listening =
      StartGrpc(config, builder, service, *listeners, unix_peers, &server);
  if (!listening.ok()) return CannotStart(listening.status());
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  auto fatal = std::make_shared<FatalState>();
  StopOnFatalError(*executor, health, fatal);
  service.SetListening(*listening);
  WarnAboutExposedListeners(config);

  SetServing(health, true);
  LogInfo("probe-sidecar %s (%s) serving on %s; metrics on %s; backend %s (%s)", kVersion,
          kGitCommit, absl::StrJoin(*listening, ", "),
          endpoint->listening.empty() ? "off" : endpoint->listening, executor->info().backend,
          executor->info().device_name);

  const ShutdownSignal signal = WaitForShutdownSignal(signals);
  std::move(stop_executor).Cancel();  // from here on, the drain stops it
  return DrainAndStop(
      {config, service, *server, *listeners, *endpoint, executor, ipc, health, fatal}, signal,
      device_abandoned);
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
