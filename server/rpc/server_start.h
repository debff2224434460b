// Starting the server: what a start reads from files and the system (checked before anything
// starts), the metrics endpoint, and the listeners (server.cc runs them in order).
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "server/config/config.h"
#include "server/observability/metrics.h"
#include "server/rpc/unix_listener.h"

namespace probesidecar::server {

// What a start reads from files and the system (TLS files, the admin token, the admin group):
// read and checked before anything starts, so that a bad path or token fails the start at once,
// before a device is touched or a probe set loaded.
struct StartInputs {
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials;
  std::string admin_token;
  std::optional<gid_t> admin_unix_gid;
};

absl::StatusOr<StartInputs> ReadStartInputs(const Config& config);

// The /metrics endpoint (none with --metrics-listen=none) and the address it is bound to.
struct MetricsEndpoint {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string listening;  // "" when off
};

// Binds --metrics-listen (nothing for "none") and serves `metrics` there.
absl::StatusOr<MetricsEndpoint> StartMetricsEndpoint(const Config& config, Metrics& metrics);

// The listeners of --listen: Unix sockets are the service's own (unix_listener.h: it accepts
// them itself to learn each peer's uid), created with --unix-socket-mode from the start; TCP
// ones are gRPC's, added to `builder` (their bound ports land in `ports` when it starts).
struct Listeners {
  std::vector<std::unique_ptr<UnixListener>> unix_sockets;
  // Per --listen address; 0 for Unix sockets. gRPC writes the bound ports through pointers into
  // this vector's buffer, which a move of Listeners keeps.
  std::vector<int> ports;
};

absl::StatusOr<Listeners> OpenListeners(const Config& config,
                                        const std::shared_ptr<grpc::ServerCredentials>& tcp,
                                        grpc::ServerBuilder& builder);

// The bound addresses (ports resolved) once gRPC has started, or an error naming a TCP address
// gRPC could not bind.
absl::StatusOr<std::vector<std::string>> BoundAddresses(const Config& config,
                                                        const std::vector<int>& ports);

// A listener other hosts can reach, in plaintext, is allowed but said out loud (a warning).
void WarnAboutExposedListeners(const Config& config);

}  // namespace probesidecar::server
