// Unix-socket listeners that the service accepts on itself, so that it knows who connected.
//
// gRPC 1.51 does not tell a handler who is on the other end of a Unix socket: the peer string of a
// connection it accepted is "unix:" and the socket's path, and insecure credentials put nothing
// in the auth context. So the service listens on its Unix sockets itself: at accept time it reads
// the peer's credentials from the kernel (SO_PEERCRED: pid, uid, gid of the process that
// connected, as they were when it connected; SO_PEERGROUPS: its supplementary groups) and records
// them against the connection's descriptor, then hands the descriptor to gRPC
// (grpc::AddInsecureChannelFromFd), which names such a connection's peer "fd:<descriptor>". A
// handler finds the credentials with UnixPeers::Find(context->peer()).
//
// The record stays right for as long as a call runs: gRPC closes a connection's descriptor only
// once the last call on it has ended (its streams hold the transport), and a descriptor number is
// recorded again, before gRPC sees it, each time accept returns it for a new connection.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace grpc {
class Server;
}

namespace probesidecar::server {

// Who connected to a Unix socket, as the kernel reported it when they connected.
struct UnixPeer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups (empty where the kernel cannot say)

  bool InGroup(gid_t group) const;
};

// The credentials of the Unix-socket connections accepted so far, by descriptor.
class UnixPeers {
 public:
  // The peer of a call whose gRPC peer string is `grpc_peer` ("fd:<n>" for connections a
  // UnixListener accepted); nullopt for any other peer (TCP, or a descriptor it never recorded).
  std::optional<UnixPeer> Find(absl::string_view grpc_peer) const;
  void Record(int fd, UnixPeer peer);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, UnixPeer> by_fd_ ABSL_GUARDED_BY(mu_);
};

class UnixListener {
 public:
  // Creates the socket at `path` with `mode` from the start (the umask is narrowed while it is
  // bound; then it is set to exactly `mode`) and listens. A stale socket file (no process accepts
  // on it) is replaced; a socket another process listens on, or a file that is not a socket,
  // fails with FAILED_PRECONDITION.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Listen(const std::string& path, mode_t mode);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Accepts on a thread of its own until Stop: records each connection's peer in `peers`, then
  // hands it to `server` (started; it must outlive Stop).
  void Start(grpc::Server* server, UnixPeers* peers);
  // Stops accepting, closes the listening socket and removes the socket file. Connections already
  // handed to gRPC stay its. Idempotent.
  void Stop();

  const std::string& path() const { return path_; }

 private:
  UnixListener(std::string path, int fd, int wake_fd);
  void AcceptLoop(grpc::Server* server, UnixPeers* peers);

  const std::string path_;
  int fd_;
  int wake_fd_;  // an eventfd: Stop wakes the accept loop through it
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace probesidecar::server
