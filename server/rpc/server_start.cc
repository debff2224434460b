#include "server/rpc/server_start.h"

#include <grp.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/observability/log.h"

namespace probesidecar::server {
namespace {

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

}  // namespace

absl::StatusOr<StartInputs> ReadStartInputs(const Config& config) {
  StartInputs inputs;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = TcpCredentials(config);
  if (!credentials.ok()) return credentials.status();
  inputs.tcp_credentials = *std::move(credentials);
  absl::StatusOr<std::string> token = AdminToken(config);
  if (!token.ok()) return token.status();
  inputs.admin_token = *std::move(token);
  absl::StatusOr<std::optional<gid_t>> gid = AdminUnixGroup(config);
  if (!gid.ok()) return gid.status();
  inputs.admin_unix_gid = *gid;
  return inputs;
}

absl::StatusOr<MetricsEndpoint> StartMetricsEndpoint(const Config& config, Metrics& metrics) {
  MetricsEndpoint endpoint;
  if (config.metrics_listen == "none") return endpoint;
  try {
    endpoint.exposer = std::make_unique<prometheus::Exposer>(config.metrics_listen);
    endpoint.exposer->RegisterCollectable(metrics.collectable());
    const std::vector<int> ports = endpoint.exposer->GetListeningPorts();
    const std::string host = config.metrics_listen.substr(0, config.metrics_listen.rfind(':'));
    endpoint.listening = absl::StrCat(host, ":", ports.empty() ? 0 : ports.front());
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint ", config.metrics_listen, ": ", e.what()));
  }
  return endpoint;
}

absl::StatusOr<Listeners> OpenListeners(const Config& config,
                                        const std::shared_ptr<grpc::ServerCredentials>& tcp,
                                        grpc::ServerBuilder& builder) {
  Listeners listeners;
  listeners.ports.assign(config.listen.size(), 0);
  for (size_t i = 0; i < config.listen.size(); ++i) {
    if (const std::string path = UnixPath(config.listen[i]); !path.empty()) {
      absl::StatusOr<std::unique_ptr<UnixListener>> listener =
          UnixListener::Listen(path, config.unix_socket_mode);
      if (!listener.ok()) {
        return absl::Status(listener.status().code(),
                            absl::StrCat("could not listen on ", config.listen[i], ": ",
                                         listener.status().message()));
      }
      listeners.unix_sockets.push_back(*std::move(listener));
      continue;
    }
    builder.AddListeningPort(config.listen[i], tcp, &listeners.ports[i]);
  }
  return listeners;
}

absl::StatusOr<std::vector<std::string>> BoundAddresses(const Config& config,
                                                        const std::vector<int>& ports) {
  std::vector<std::string> listening;
  for (size_t i = 0; i < config.listen.size(); ++i) {
    const std::string& address = config.listen[i];
    if (absl::StartsWith(address, "unix:")) {
      listening.push_back(address);
    } else if (ports[i] == 0) {
      return absl::UnavailableError(absl::StrCat("could not listen on ", address));
    } else {
      listening.push_back(absl::StrCat(address.substr(0, address.rfind(':')), ":", ports[i]));
    }
  }
  return listening;
}

// (Without an admin credential, TCP clients are never admin: nothing more to say.)
void WarnAboutExposedListeners(const Config& config) {
  for (const std::string& address : config.listen) {
    const bool loopback = absl::StartsWith(address, "unix:") || absl::StartsWith(address, "127.") ||
                          absl::StartsWith(address, "[::1]") ||
                          absl::StartsWith(address, "localhost:");
    if (!loopback && config.tls_cert_file.empty()) {
      LogWarning("%s is reachable from other hosts in plaintext (no --tls-cert)", address);
    }
  }
}

}  // namespace probesidecar::server
