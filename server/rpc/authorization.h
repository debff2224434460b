// Who may do what, decided from a call's peer and credentials (docs/reliability.md, "Who is
// trusted"): the admin RPCs (loading and unloading probe sets), and CUDA IPC registrations, which
// come from this host only.
#pragma once

#include <grpcpp/server_context.h>
#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "server/rpc/unix_listener.h"

namespace probesidecar::server {

class Authorizer {
 public:
  // `admin_token`: read from --admin-token-file ("" when not set); `admin_tls_identity`:
  // --admin-tls-identity; `admin_unix_gid`: --admin-unix-group, resolved; `unix_peers`: who is on
  // the other end of the Unix-socket connections (nullptr: no Unix-socket peer is known, and none
  // is admin without a credential); `server_uid`: the server's effective uid;
  // `allow_remote_ipc`: --allow-remote-ipc.
  Authorizer(std::string admin_token, std::string admin_tls_identity,
             std::optional<gid_t> admin_unix_gid, const UnixPeers* unix_peers, uid_t server_uid,
             bool allow_remote_ipc);

  // The admin RPCs. Without --admin-token-file and --admin-tls-identity: only Unix-socket peers
  // whose uid is the server's or root (or who are in --admin-unix-group), PERMISSION_DENIED for
  // everyone else, TCP included, naming the flags that allow more. With either: the caller must
  // present the token or the mutual-TLS identity, or be a Unix-socket peer in --admin-unix-group
  // (UNAUTHENTICATED without credentials, PERMISSION_DENIED with wrong ones).
  absl::Status AuthorizeAdmin(grpc::CallbackServerContext* context) const;

  // IPC registrations come from this host: Unix socket or loopback TCP peers (PERMISSION_DENIED
  // otherwise, unless --allow-remote-ipc).
  absl::Status CheckLocalPeer(grpc::CallbackServerContext* context) const;

 private:
  // Whether a Unix-socket peer is admin by its credentials alone.
  bool IsAdminPeer(const UnixPeer& peer) const;

  const std::string admin_token_;
  const std::string admin_tls_identity_;
  const std::optional<gid_t> admin_unix_gid_;
  const UnixPeers* const unix_peers_;
  const uid_t server_uid_;
  const bool allow_remote_ipc_;
};

}  // namespace probesidecar::server
