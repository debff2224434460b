#include "server/rpc/authorization.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace probesidecar::server {
namespace {

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

Authorizer::Authorizer(std::string admin_token, std::string admin_tls_identity,
                       std::optional<gid_t> admin_unix_gid, const UnixPeers* unix_peers,
                       uid_t server_uid, bool allow_remote_ipc)
    : admin_token_(std::move(admin_token)),
      admin_tls_identity_(std::move(admin_tls_identity)),
      admin_unix_gid_(admin_unix_gid),
      unix_peers_(unix_peers),
      server_uid_(server_uid),
      allow_remote_ipc_(allow_remote_ipc) {}

bool Authorizer::IsAdminPeer(const UnixPeer& peer) const {
  // The server's own user and root, unless an admin credential (token, TLS identity) says who is
  // admin; --admin-unix-group's members always.
  const bool credential = !admin_token_.empty() || !admin_tls_identity_.empty();
  if (!credential && (peer.uid == server_uid_ || peer.uid == 0)) return true;
  return admin_unix_gid_.has_value() && peer.InGroup(*admin_unix_gid_);
}

absl::Status Authorizer::AuthorizeAdmin(grpc::CallbackServerContext* context) const {
  const std::string peer_name = context->peer();
  const std::optional<UnixPeer> unix_peer =
      unix_peers_ != nullptr ? unix_peers_->Find(peer_name) : std::nullopt;
  if (unix_peer.has_value() && IsAdminPeer(*unix_peer)) return absl::OkStatus();
  if (admin_token_.empty() && admin_tls_identity_.empty()) {
    // No admin credential: the Unix socket's peer credentials decide, and TCP is never admin.
    const std::string allowed = absl::StrCat(
        "only the server's own user (uid ", server_uid_, ") and root",
        admin_unix_gid_.has_value()
            ? absl::StrCat(", or members of group ", *admin_unix_gid_, " (--admin-unix-group),")
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
  if (!admin_token_.empty()) {
    const auto& metadata = context->client_metadata();
    if (auto it = metadata.find("authorization"); it != metadata.end()) {
      presented = true;
      const std::string given(it->second.data(), it->second.size());
      if (ConstantTimeEquals(given, absl::StrCat("Bearer ", admin_token_))) return absl::OkStatus();
    }
  }
  if (!admin_tls_identity_.empty()) {
    std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
    if (auth != nullptr && auth->IsPeerAuthenticated()) {
      presented = true;
      for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
        if (std::string(name.data(), name.size()) == admin_tls_identity_) return absl::OkStatus();
      }
    }
  }
  if (!presented) {
    return absl::UnauthenticatedError(absl::StrCat(
        "loading and unloading probe sets needs the admin token (metadata 'authorization: Bearer "
        "<token>') or the admin's TLS client certificate",
        admin_unix_gid_.has_value() ? ", or a Unix-socket client in --admin-unix-group" : ""));
  }
  return absl::PermissionDeniedError("these credentials may not load or unload probe sets");
}

absl::Status Authorizer::CheckLocalPeer(grpc::CallbackServerContext* context) const {
  if (allow_remote_ipc_) return absl::OkStatus();
  const std::string peer = context->peer();
  if (IsLocalPeer(peer)) return absl::OkStatus();
  if (unix_peers_ != nullptr && unix_peers_->Find(peer).has_value()) {
    return absl::OkStatus();  // the Unix socket
  }
  return absl::PermissionDeniedError(
      absl::StrCat("CUDA IPC registrations are accepted from this host only (Unix socket or "
                   "loopback), not from ",
                   QuotePeer(peer), "; start the server with --allow-remote-ipc to accept them"));
}

}  // namespace probesidecar::server
