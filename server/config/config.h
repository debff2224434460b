// probe-sidecar's command line: every flag, its default (Config's initialisers), and its --help
// text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/probe_score/probe_score_precision.h"

namespace probesidecar::server {

enum class Backend { kAuto, kCpu, kCuda };

struct Config {
  // gRPC listeners: "unix:/path" (or "unix:///path") and "host:port" (port 0 picks a free one).
  std::vector<std::string> listen = {"unix:/tmp/probe-sidecar.sock", "127.0.0.1:50551"};
  // Prometheus /metrics endpoint, "host:port"; "none" turns it off.
  std::string metrics_listen = "127.0.0.1:9464";
  // Directory of *.safetensors probe sets loaded at start; LoadProbeSet paths stay inside it.
  // Empty: the bundled demo directory next to the binary.
  std::string probes_dir;
  Backend backend = Backend::kAuto;
  // The CUDA devices served (--devices): one executor, context and IPC registry per device.
  // all_devices: every device the process sees (counted at start); else `devices`, ascending,
  // each once.
  bool all_devices = false;
  std::vector<int> devices = {0};
  // The one device a CUDA executor serves: the first of `devices` (--device); MakeExecutor sets
  // it for each device's executor.
  int device = 0;
  uint64_t max_message_bytes = uint64_t{64} << 20;
  uint32_t max_concurrent_requests = 256;
  // Requests waiting for a worker, per executor; more are refused with RESOURCE_EXHAUSTED.
  uint32_t max_queued_requests = 128;
  uint32_t max_rows = 65536;
  uint32_t max_probes = 65536;
  uint64_t max_probe_file_bytes = uint64_t{1} << 30;
  // CPU backend threads; 0 = one per core.
  uint32_t cpu_threads = 0;
  // CUDA backend: workers (each a stream with its own staging and graphs) and graph cache size.
  uint32_t cuda_workers = 4;
  uint32_t graph_cache_entries = 256;
  // CUDA events around the GPU stages (staging, kernel) of one request in N: 1 = every request,
  // 0 = none. Timed requests replay a graph variant with event nodes, which costs a few µs.
  uint32_t gpu_timing_every = 1;
  // Row buckets whose graphs are captured at start for every loaded probe set.
  std::vector<uint32_t> warmup_rows = {1, 64};
  // Time in-flight RPCs get to finish after SIGINT/SIGTERM before they are cancelled.
  double shutdown_grace_seconds = 10.0;

  // Access control (docs/reliability.md).
  // Permissions of the Unix sockets the server creates.
  uint32_t unix_socket_mode = 0660;
  // TLS for TCP listeners (PEM files); with a client CA, clients must present a certificate it
  // signed (mutual TLS). Unix sockets stay plain (their file mode guards them).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Loading and unloading probe sets need the token in the token file (metadata
  // "authorization: Bearer <token>"), or a mutual-TLS client certificate whose common name is
  // `admin_tls_identity`.
  std::string admin_token_file;
  std::string admin_tls_identity;
  // Unix-socket clients in this group (a name or a numeric gid) may load and unload probe sets.
  // With no admin credential at all, only the server's own user and root may, over the Unix
  // socket (their uid read with SO_PEERCRED); TCP clients never may.
  std::string admin_unix_group;
  // IPC registrations (buffers, events, sessions) from TCP peers that are not on this host.
  bool allow_remote_ipc = false;
  // Buffers registered without a session (usable by any client that knows their id).
  bool allow_sessionless_buffers = false;
  // Bytes of buffer windows one session may have registered.
  uint64_t max_session_buffer_bytes = uint64_t{1} << 40;

  // Probe sets: how many, how many weight bytes in all; a bad file in --probes at start fails
  // the start (strict) or is skipped with an error log and a metric.
  uint32_t max_probe_sets = 256;
  uint64_t max_probe_set_bytes = uint64_t{16} << 30;
  bool strict_probes = false;
  // The precision asked for the sets loaded at start (--probes, or the bundled demo set):
  // default (exact up to kExactByDefaultMaxProbes probes, fast above), exact or fast.
  // LoadProbeSet asks for its own.
  kernels::ProbePrecisionRequest probe_precision = kernels::ProbePrecisionRequest::kDefault;
  std::string log_level = "info";

  // Probe outcomes (dashboards/README.md, "Probe outcomes"): the labels a session may declare on
  // the outcome series of its requests; how many distinct sets of their values get series of
  // their own (later ones are counted as "_other"); how many probes of a set are labelled by name
  // (a set of more probes exports set-level series only, probe="_all").
  std::vector<std::string> session_labels = {"model", "replica"};
  // Whether the outcomes of a set's probes are counted, for the sets loaded at start and those
  // whose LoadProbeSet leaves it unspecified (--probe-outcomes).
  bool count_outcomes = true;
  uint32_t max_session_label_sets = 16;
  uint32_t max_probe_labels = 64;
};

// What ParseFlags found: a config to run, or a request for help/version text.
struct ParsedFlags {
  Config config;
  bool show_help = false;
  bool show_version = false;
};

// Parses argv (argv[0] is skipped). Accepts --flag=value and --flag value; --listen may repeat
// (the first occurrence replaces the defaults). Unknown flags and bad values are
// INVALID_ARGUMENT with a message naming the flag.
absl::StatusOr<ParsedFlags> ParseFlags(int argc, const char* const* argv);

// The --help text. The defaults it names are those of `defaults`: Config{} for the binary, so
// that each default is written once.
std::string HelpText(const Config& defaults = Config{});

const char* BackendName(Backend backend);

}  // namespace probesidecar::server
