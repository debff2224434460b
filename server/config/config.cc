#include "server/config/config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "server/observability/outcome_labels.h"

namespace probesidecar::server {
namespace {

using Setter = std::function<absl::Status(absl::string_view value, Config& config)>;

// Writes the default of one flag as --help shows it, from a Config (Config{} for the binary).
using ShowDefault = std::string (*)(const Config& defaults);

struct Flag {
  const char* name;
  const char* value_name;  // nullptr for switches
  // The --help text: "{default}" stands for what `show_default` writes, so that each default is
  // written once, in Config.
  const char* help;
  Setter set;
  ShowDefault show_default = nullptr;
};

// A size as the flags accept it: the largest of Gi, Mi, Ki that divides it, else bytes.
std::string ShowSize(uint64_t bytes) {
  static constexpr std::pair<const char*, int> kSuffixes[] = {{"Gi", 30}, {"Mi", 20}, {"Ki", 10}};
  for (const auto& [suffix, shift] : kSuffixes) {
    const uint64_t scale = uint64_t{1} << shift;
    if (bytes != 0 && bytes % scale == 0) return absl::StrCat(bytes / scale, suffix);
  }
  return absl::StrCat(bytes);
}

const char* PrecisionRequestName(kernels::ProbePrecisionRequest request) {
  switch (request) {
    case kernels::ProbePrecisionRequest::kExact:
      return "exact";
    case kernels::ProbePrecisionRequest::kFast:
      return "fast";
    case kernels::ProbePrecisionRequest::kDefault:
      break;
  }
  return "default";
}

absl::Status BadValue(absl::string_view flag, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", why));
}

// Integers with an optional binary suffix: 64Mi, 1Gi, 512Ki.
absl::StatusOr<uint64_t> ParseSize(absl::string_view flag, absl::string_view value) {
  absl::string_view digits = value;
  uint64_t scale = 1;
  if (absl::ConsumeSuffix(&digits, "Ki")) {
    scale = uint64_t{1} << 10;
  } else if (absl::ConsumeSuffix(&digits, "Mi")) {
    scale = uint64_t{1} << 20;
  } else if (absl::ConsumeSuffix(&digits, "Gi")) {
    scale = uint64_t{1} << 30;
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(digits, &n)) return BadValue(flag, value, "not a non-negative integer");
  uint64_t out = 0;
  if (__builtin_mul_overflow(n, scale, &out)) return BadValue(flag, value, "too large");
  return out;
}

absl::StatusOr<uint32_t> ParseCount(absl::string_view flag, absl::string_view value, uint32_t min,
                                    uint32_t max) {
  uint32_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < min || n > max) {
    return BadValue(flag, value, absl::StrCat("expected an integer in [", min, ", ", max, "]"));
  }
  return n;
}

template <typename T>
Setter Count(T Config::*field, const char* flag, uint32_t min, uint32_t max) {
  return [=](absl::string_view value, Config& config) -> absl::Status {
    absl::StatusOr<uint32_t> n = ParseCount(flag, value, min, max);
    if (!n.ok()) return n.status();
    config.*field = static_cast<T>(*n);
    return absl::OkStatus();
  };
}

Setter Size(uint64_t Config::*field, const char* flag, uint64_t min, uint64_t max) {
  return [=](absl::string_view value, Config& config) -> absl::Status {
    absl::StatusOr<uint64_t> n = ParseSize(flag, value);
    if (!n.ok()) return n.status();
    if (*n < min || *n > max) {
      return BadValue(flag, value, absl::StrCat("expected a size in [", min, ", ", max, "]"));
    }
    config.*field = *n;
    return absl::OkStatus();
  };
}

// A switch (no value) that sets `field`.
Setter Switch(bool Config::*field) {
  return [=](absl::string_view, Config& config) {
    config.*field = true;
    return absl::OkStatus();
  };
}

absl::Status NonEmpty(absl::string_view flag, absl::string_view value, std::string* out) {
  if (value.empty()) return BadValue(flag, value, "empty");
  *out = std::string(value);
  return absl::OkStatus();
}

absl::Status CheckListenAddress(absl::string_view flag, absl::string_view value) {
  if (absl::StartsWith(value, "unix:")) {
    absl::string_view path = value.substr(5);
    absl::ConsumePrefix(&path, "//");
    if (path.empty() || path[0] != '/') {
      return BadValue(flag, value, "a Unix socket address is unix:/absolute/path");
    }
    // sun_path holds 108 bytes including the terminating NUL.
    if (path.size() > 107)
      return BadValue(flag, value, "Unix socket path is longer than 107 bytes");
    return absl::OkStatus();
  }
  const size_t colon = value.rfind(':');
  uint32_t port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port > 65535) {
    return BadValue(flag, value, "expected host:port (port 0-65535) or unix:/path");
  }
  return absl::OkStatus();
}

// --devices=all|N[,N...] (and --device=N): ordinals in [0, 1023], each once, kept ascending.
absl::Status ParseDevices(absl::string_view flag, absl::string_view value, Config& config) {
  if (flag == "devices" && value == "all") {
    config.all_devices = true;
    config.devices.clear();
    return absl::OkStatus();
  }
  std::vector<int> devices;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    absl::StatusOr<uint32_t> n = ParseCount(flag, part, 0, 1023);
    if (!n.ok()) {
      return BadValue(flag, value,
                      flag == "device" ? "expected a device ordinal in [0, 1023]"
                                       : "expected all, or device ordinals in [0, 1023] "
                                         "separated by commas");
    }
    if (std::find(devices.begin(), devices.end(), static_cast<int>(*n)) != devices.end()) {
      return BadValue(flag, value, absl::StrCat("device ", *n, " is listed twice"));
    }
    devices.push_back(static_cast<int>(*n));
  }
  if (flag == "device" && devices.size() != 1) {
    return BadValue(flag, value, "one device ordinal (--devices takes a list)");
  }
  std::sort(devices.begin(), devices.end());
  config.all_devices = false;
  config.devices = std::move(devices);
  config.device = config.devices.front();
  return absl::OkStatus();
}

const std::vector<Flag>& Flags() {
  static const auto* flags = new std::vector<Flag>{
      {"listen", "ADDR",
       "gRPC listener, unix:/path or host:port (port 0: any free port). Repeatable; the first "
       "use replaces the defaults {default}.",
       nullptr,  // handled in ParseFlags: it accumulates
       [](const Config& c) { return absl::StrJoin(c.listen, " and "); }},
      {"metrics-listen", "HOST:PORT",
       "Prometheus /metrics endpoint (default {default}); 'none' turns it off.",
       [](absl::string_view v, Config& c) -> absl::Status {
         if (v != "none") {
           absl::Status s = CheckListenAddress("metrics-listen", v);
           if (!s.ok()) return s;
           if (absl::StartsWith(v, "unix:")) {
             return BadValue("metrics-listen", v, "the metrics endpoint listens on TCP only");
           }
         }
         c.metrics_listen = std::string(v);
         return absl::OkStatus();
       },
       [](const Config& c) { return c.metrics_listen; }},
      {"probes", "DIR",
       "Directory of probe sets (*.safetensors, each named by its file stem) loaded at start; "
       "LoadProbeSet paths must stay inside it. Default: the bundled demo set, "
       "<binary>/../share/probe-sidecar/probes.",
       [](absl::string_view v, Config& c) -> absl::Status {
         if (v.empty()) return BadValue("probes", v, "empty directory");
         c.probes_dir = std::string(v);
         return absl::OkStatus();
       }},
      {"backend", "auto|cpu|cuda",
       "auto uses the GPUs of --devices when they are usable, else (none usable) the CPU backend "
       "(inline tensors only); cuda fails to start without a GPU; both fail to start when some "
       "of those devices are usable and others not, or on a GPU this build holds no code for "
       "(docs/gpu-support.md) (default {default}).",
       [](absl::string_view v, Config& c) -> absl::Status {
         if (v == "auto") {
           c.backend = Backend::kAuto;
         } else if (v == "cpu") {
           c.backend = Backend::kCpu;
         } else if (v == "cuda") {
           c.backend = Backend::kCuda;
         } else {
           return BadValue("backend", v, "expected auto, cpu or cuda");
         }
         return absl::OkStatus();
       },
       [](const Config& c) -> std::string { return BackendName(c.backend); }},
      {"devices", "all|N[,N...]",
       "CUDA devices to serve, by ordinal, or all the process sees (default {default}). One "
       "server serves them all: per device a CUDA context, stream slots, graph cache and the "
       "probe sets' weights; a buffer or event is registered on the device it lives on, and a "
       "request runs on the device of its buffers (docs/tensor-parallel.md).",
       nullptr,  // handled in ParseFlags: --device is its one-device alias
       [](const Config& c) -> std::string {
         return c.all_devices ? "all" : absl::StrJoin(c.devices, ",");
       }},
      {"device", "N", "The same as --devices=N (one device).", nullptr},
      {"max-message-bytes", "BYTES",
       "Largest gRPC message received or sent (default {default}; suffixes Ki, Mi, Gi).",
       Size(&Config::max_message_bytes, "max-message-bytes", 4096, uint64_t{2047} << 20),
       [](const Config& c) { return ShowSize(c.max_message_bytes); }},
      {"max-concurrent-requests", "N",
       "Score/Verify requests in progress at once; more are refused with RESOURCE_EXHAUSTED "
       "(default {default}).",
       Count(&Config::max_concurrent_requests, "max-concurrent-requests", 1, 1 << 20),
       [](const Config& c) { return absl::StrCat(c.max_concurrent_requests); }},
      {"max-queued-requests", "N",
       "Requests waiting for a worker (a GPU's stream slots, per served GPU, or the CPU threads); "
       "more are refused with RESOURCE_EXHAUSTED at once (default {default}).",
       Count(&Config::max_queued_requests, "max-queued-requests", 1, 1 << 20),
       [](const Config& c) { return absl::StrCat(c.max_queued_requests); }},
      {"max-rows", "N", "Largest number of rows in one Score request (default {default}).",
       Count(&Config::max_rows, "max-rows", 1, 1 << 24),
       [](const Config& c) { return absl::StrCat(c.max_rows); }},
      {"max-probes", "N", "Largest number of probes in one probe set (default {default}).",
       Count(&Config::max_probes, "max-probes", 1, 1 << 24),
       [](const Config& c) { return absl::StrCat(c.max_probes); }},
      {"max-probe-file-bytes", "BYTES", "Largest probe set file (default {default}).",
       Size(&Config::max_probe_file_bytes, "max-probe-file-bytes", 64, uint64_t{16} << 30),
       [](const Config& c) { return ShowSize(c.max_probe_file_bytes); }},
      {"cpu-threads", "N", "CPU backend worker threads; 0 = one per core (default {default}).",
       Count(&Config::cpu_threads, "cpu-threads", 0, 4096),
       [](const Config& c) { return absl::StrCat(c.cpu_threads); }},
      {"cuda-workers", "N",
       "CUDA backend workers per served GPU, each with its own stream, staging buffers and graphs "
       "(default {default}).",
       Count(&Config::cuda_workers, "cuda-workers", 1, 64),
       [](const Config& c) { return absl::StrCat(c.cuda_workers); }},
      {"graph-cache-entries", "N", "Captured CUDA graphs kept per worker (default {default}).",
       Count(&Config::graph_cache_entries, "graph-cache-entries", 1, 1 << 16),
       [](const Config& c) { return absl::StrCat(c.graph_cache_entries); }},
      {"gpu-timing-every", "N",
       "Time the GPU stages (staging, kernel) with CUDA events on one request in N (1: every "
       "request; 0: never; default {default}). Timed requests replay a graph with event nodes.",
       Count(&Config::gpu_timing_every, "gpu-timing-every", 0, 1 << 20),
       [](const Config& c) { return absl::StrCat(c.gpu_timing_every); }},
      {"warmup-rows", "R[,R...]",
       "Row buckets whose graphs are captured at start for each loaded probe set (default "
       "{default}; 'none' for none).",
       [](absl::string_view v, Config& c) -> absl::Status {
         c.warmup_rows.clear();
         if (v == "none") return absl::OkStatus();
         for (absl::string_view part : absl::StrSplit(v, ',')) {
           absl::StatusOr<uint32_t> n = ParseCount("warmup-rows", part, 1, 1 << 24);
           if (!n.ok()) return n.status();
           c.warmup_rows.push_back(*n);
         }
         return absl::OkStatus();
       },
       [](const Config& c) -> std::string {
         return c.warmup_rows.empty() ? "none" : absl::StrJoin(c.warmup_rows, ",");
       }},
      {"shutdown-grace-seconds", "S",
       "On SIGINT/SIGTERM, time in-flight RPCs get to finish before they are cancelled "
       "(default {default}).",
       [](absl::string_view v, Config& c) -> absl::Status {
         double s = 0;
         if (!absl::SimpleAtod(v, &s) || !std::isfinite(s) || s < 0 || s > 3600) {
           return BadValue("shutdown-grace-seconds", v, "expected seconds in [0, 3600]");
         }
         c.shutdown_grace_seconds = s;
         return absl::OkStatus();
       },
       [](const Config& c) { return absl::StrCat(c.shutdown_grace_seconds); }},
      {"unix-socket-mode", "MODE",
       "Permissions of the Unix sockets, octal: 0660 lets the server's user and group connect "
       "(default {default}).",
       [](absl::string_view v, Config& c) -> absl::Status {
         uint32_t mode = 0;
         bool octal = !v.empty() && v.size() <= 4;
         for (char d : v) {
           octal = octal && d >= '0' && d <= '7';
           mode = mode * 8 + static_cast<uint32_t>(d - '0');
         }
         if (!octal || mode > 0777) {
           return BadValue("unix-socket-mode", v, "expected an octal mode such as 0660");
         }
         c.unix_socket_mode = mode;
         return absl::OkStatus();
       },
       [](const Config& c) { return absl::StrFormat("%04o", c.unix_socket_mode); }},
      {"tls-cert", "FILE", "PEM certificate (chain) of TCP listeners: TLS on TCP.",
       [](absl::string_view v, Config& c) { return NonEmpty("tls-cert", v, &c.tls_cert_file); }},
      {"tls-key", "FILE", "PEM private key of --tls-cert.",
       [](absl::string_view v, Config& c) { return NonEmpty("tls-key", v, &c.tls_key_file); }},
      {"tls-client-ca", "FILE",
       "PEM CA certificates: TCP clients must present a certificate one of them signed "
       "(mutual TLS). Needs --tls-cert.",
       [](absl::string_view v, Config& c) {
         return NonEmpty("tls-client-ca", v, &c.tls_client_ca_file);
       }},
      {"admin-token-file", "FILE",
       "LoadProbeSet and UnloadProbeSet need the token in this file (first line), sent as gRPC "
       "metadata 'authorization: Bearer <token>' (or --admin-tls-identity, "
       "--admin-unix-group). Without any of the three, only the server's own user and root may "
       "load and unload probe sets, over the Unix socket (their uid is read from the socket); "
       "TCP clients may not.",
       [](absl::string_view v, Config& c) {
         return NonEmpty("admin-token-file", v, &c.admin_token_file);
       }},
      {"admin-tls-identity", "NAME",
       "A mutual-TLS client whose certificate's common name is NAME may load and unload probe "
       "sets (or --admin-token-file).",
       [](absl::string_view v, Config& c) {
         return NonEmpty("admin-tls-identity", v, &c.admin_tls_identity);
       }},
      {"admin-unix-group", "GROUP",
       "Unix-socket clients in GROUP (a name or a gid; primary or supplementary group of the "
       "connecting process) may load and unload probe sets, whatever other admin flag is set.",
       [](absl::string_view v, Config& c) {
         return NonEmpty("admin-unix-group", v, &c.admin_unix_group);
       }},
      {"allow-remote-ipc", nullptr,
       "Accept RegisterBuffer and RegisterEvent from TCP peers not on this host "
       "(refused by default: CUDA IPC only works on one host).",
       Switch(&Config::allow_remote_ipc)},
      {"allow-sessionless-buffers", nullptr,
       "Accept buffers registered without a session (any client that knows the id could then "
       "use them). By default a buffer belongs to the session that registered it.",
       Switch(&Config::allow_sessionless_buffers)},
      {"max-session-buffer-bytes", "BYTES",
       "Bytes of buffer windows one session may have registered (default {default}).",
       Size(&Config::max_session_buffer_bytes, "max-session-buffer-bytes", 1, uint64_t{1} << 50),
       [](const Config& c) { return ShowSize(c.max_session_buffer_bytes); }},
      {"max-probe-sets", "N", "Probe sets loaded at once (default {default}).",
       Count(&Config::max_probe_sets, "max-probe-sets", 1, 1 << 20),
       [](const Config& c) { return absl::StrCat(c.max_probe_sets); }},
      {"max-probe-set-bytes", "BYTES",
       "Bytes of the weights and biases of all loaded probe sets together, as float32 (each set "
       "is held once in host memory and once on each served GPU; default {default}).",
       Size(&Config::max_probe_set_bytes, "max-probe-set-bytes", 64, uint64_t{1} << 44),
       [](const Config& c) { return ShowSize(c.max_probe_set_bytes); }},
      {"strict-probes", nullptr,
       "Fail the start when a file in --probes cannot be loaded (default: skip it, log the error "
       "and count it in probesidecar_probe_set_load_errors_total).",
       Switch(&Config::strict_probes)},
      {"probe-precision", "default|exact|fast",
       "Precision of the probe sets loaded at start (--probes, or the bundled demo set; default "
       "'{default}'). exact: the file's float32 weights, float32 math on every path; fast: the "
       "weights rounded to the activations' 16-bit type on tensor cores; default: exact for "
       "sets of up to {exact_by_default_max_probes} probes (free there), fast above. "
       "LoadProbeSet chooses its own.",
       [](absl::string_view v, Config& c) -> absl::Status {
         if (!kernels::ParseProbePrecisionRequest(std::string(v).c_str(), &c.probe_precision)) {
           return BadValue("probe-precision", v, "expected default, exact or fast");
         }
         return absl::OkStatus();
       },
       [](const Config& c) -> std::string { return PrecisionRequestName(c.probe_precision); }},
      {"probe-outcomes", "on|off",
       "Count what each probe set's probes find (rows scored, fired, non-finite, score "
       "histograms: the probe-outcome metrics and ListProbeSets' outcomes), for the sets loaded at "
       "start and those whose LoadProbeSet does not choose (default {default}). off: those sets "
       "have no outcome series and their scores stay out of the non-finite device-output total; "
       "responses are unchanged.",
       [](absl::string_view v, Config& c) -> absl::Status {
         if (v != "on" && v != "off") return BadValue("probe-outcomes", v, "expected on or off");
         c.count_outcomes = v == "on";
         return absl::OkStatus();
       },
       [](const Config& c) -> std::string { return c.count_outcomes ? "on" : "off"; }},
      {"session-labels", "NAME[,NAME...]",
       "Labels a session may declare at OpenSession (e.g. model=llama-3-8b), which then label the "
       "probe-outcome series of its requests (default {default}; 'none' for none). Prometheus "
       "label names, at most 8.",
       [](absl::string_view v, Config& c) -> absl::Status {
         std::vector<std::string> keys;
         if (v != "none") keys = absl::StrSplit(v, ',');
         if (absl::Status s = OutcomeLabels::ValidateKeys(keys); !s.ok()) {
           return BadValue("session-labels", v, s.message());
         }
         c.session_labels = std::move(keys);
         return absl::OkStatus();
       },
       [](const Config& c) -> std::string {
         return c.session_labels.empty() ? "none" : absl::StrJoin(c.session_labels, ",");
       }},
      {"max-session-label-sets", "N",
       "Distinct sets of session label values that get probe-outcome series of their own; "
       "sessions declaring further ones are counted with every label \"_other\" (default "
       "{default}).",
       Count(&Config::max_session_label_sets, "max-session-label-sets", 0, 1024),
       [](const Config& c) { return absl::StrCat(c.max_session_label_sets); }},
      {"max-probe-labels", "N",
       "Probes of one set whose outcome series carry their name (label probe); a set of more "
       "probes exports set-level series only, probe=\"_all\" (default {default}).",
       Count(&Config::max_probe_labels, "max-probe-labels", 0, 1 << 16),
       [](const Config& c) { return absl::StrCat(c.max_probe_labels); }},
      {"log-level", "debug|info|warning|error",
       "Least severe level logged to stderr (default {default}).",
       [](absl::string_view v, Config& c) -> absl::Status {
         if (v != "debug" && v != "info" && v != "warning" && v != "error") {
           return BadValue("log-level", v, "expected debug, info, warning or error");
         }
         c.log_level = std::string(v);
         return absl::OkStatus();
       },
       [](const Config& c) { return c.log_level; }},
      {"help", nullptr, "Print this help and exit.", nullptr},
      {"version", nullptr, "Print the version and exit.", nullptr},
  };
  return *flags;
}

}  // namespace

const char* BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kCpu:
      return "cpu";
    case Backend::kCuda:
      return "cuda";
  }
  return "unknown";
}

absl::StatusOr<ParsedFlags> ParseFlags(int argc, const char* const* argv) {
  ParsedFlags parsed;
  bool listen_given = false;
  const char* device_flag = nullptr;  // "device" or "devices", once given
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (flags start with --; see --help)"));
    }
    absl::string_view name = arg;
    absl::string_view value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : Flags()) {
      if (name == f.name) flag = &f;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (flag->value_name == nullptr) {
      if (has_value) return BadValue(name, value, "this flag takes no value");
      if (name == "help") parsed.show_help = true;
      if (name == "version") parsed.show_version = true;
      if (flag->set) {
        if (absl::Status s = flag->set("", parsed.config); !s.ok()) return s;
      }
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = argv[++i];
    }
    if (name == "devices" || name == "device") {
      if (device_flag != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " after --", device_flag,
                         ": give the devices once (--device=N is --devices=N)"));
      }
      device_flag = flag->name;
      absl::Status s = ParseDevices(name, value, parsed.config);
      if (!s.ok()) return s;
      continue;
    }
    if (name == "listen") {
      absl::Status s = CheckListenAddress(name, value);
      if (!s.ok()) return s;
      if (!listen_given) parsed.config.listen.clear();
      listen_given = true;
      parsed.config.listen.emplace_back(value);
      continue;
    }
    absl::Status s = flag->set(value, parsed.config);
    if (!s.ok()) return s;
  }
  const Config& c = parsed.config;
  if (c.tls_cert_file.empty() != c.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!c.tls_client_ca_file.empty() && c.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  if (!c.admin_tls_identity.empty() && c.tls_client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--admin-tls-identity needs mutual TLS (--tls-client-ca) to know who the client is");
  }
  return parsed;
}

std::string HelpText(const Config& defaults) {
  std::string text = absl::StrCat(
      "probe-sidecar: scores LLM hidden states with linear probes over gRPC, next to an "
      "inference server.\n\nUsage: probe-sidecar [flags]\n\nWith no flags it listens on ",
      absl::StrJoin(defaults.listen, " and "), ", serves /metrics on ", defaults.metrics_listen,
      ", loads the bundled demo probe set and picks the GPU if there is one.\n\nFlags:\n");
  for (const Flag& f : Flags()) {
    std::string head = absl::StrCat("  --", f.name);
    if (f.value_name != nullptr) absl::StrAppend(&head, "=", f.value_name);
    const std::string help = absl::StrReplaceAll(
        f.help,
        {{"{default}", f.show_default != nullptr ? f.show_default(defaults) : ""},
         {"{exact_by_default_max_probes}", absl::StrCat(kernels::kExactByDefaultMaxProbes)}});
    absl::StrAppend(&text, head, "\n      ", help, "\n");
  }
  absl::StrAppend(&text,
                  "\nSIGINT/SIGTERM: stop accepting, let in-flight RPCs finish (up to "
                  "--shutdown-grace-seconds), exit 0.\n");
  return text;
}

}  // namespace probesidecar::server
