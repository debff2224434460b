#include "server/rpc/unix_listener.h"

#include <errno.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/observability/log.h"

namespace probesidecar::server {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(what, " ", path, ": ", strerror(errno)));
}

sockaddr_un AddressOf(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::copy_n(path.data(), std::min(path.size(), sizeof(address.sun_path) - 1), address.sun_path);
  return address;
}

// Whether some process accepts connections on the socket at `path`.
bool SomeoneListens(const std::string& path) {
  const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (probe < 0) return false;
  const sockaddr_un address = AddressOf(path);
  const int r = ::connect(probe, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  // A full backlog (EAGAIN) still means a listener.
  const bool listening = r == 0 || errno == EAGAIN || errno == EINPROGRESS;
  ::close(probe);
  return listening;
}

// The peer's credentials, or nullopt when the kernel does not give them.
std::optional<UnixPeer> PeerOf(int fd) {
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0 ||
      length != sizeof(credentials)) {
    return std::nullopt;
  }
  UnixPeer peer;
  peer.pid = credentials.pid;
  peer.uid = credentials.uid;
  peer.gid = credentials.gid;
#ifdef SO_PEERGROUPS
  std::vector<gid_t> groups(16);
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups = std::move(groups);
      break;
    }
    if (errno != ERANGE) break;  // e.g. ENOPROTOOPT before Linux 4.13: the primary gid only
    groups.resize(bytes / sizeof(gid_t) + 1);
  }
#endif
  return peer;
}

}  // namespace

bool UnixPeer::InGroup(gid_t group) const {
  return gid == group || std::find(groups.begin(), groups.end(), group) != groups.end();
}

std::optional<UnixPeer> UnixPeers::Find(absl::string_view grpc_peer) const {
  int fd = -1;
  if (!absl::ConsumePrefix(&grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer, &fd)) {
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

void UnixPeers::Record(int fd, UnixPeer peer) {
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = std::move(peer);
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Listen(const std::string& path,
                                                                   mode_t mode) {
  if (path.empty() || path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("Unix socket path '", path, "' is too long"));
  }
  struct stat existing {};
  if (::lstat(path.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket: not replaced"));
    }
    if (SomeoneListens(path)) {
      return absl::FailedPreconditionError(absl::StrCat("another process is listening on ", path));
    }
    ::unlink(path.c_str());  // stale: left by a process that did not remove it
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno("socket for", path);
  const sockaddr_un address = AddressOf(path);
  // The socket file is created with `mode` from the start: no moment in which the umask's wider
  // mode applies. (The umask is the process's; nothing else creates files during start-up.)
  const mode_t old_umask = ::umask(0777 & ~mode);
  const int bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int bind_errno = errno;
  ::umask(old_umask);
  if (bound != 0) {
    errno = bind_errno;
    absl::Status status = Errno("bind", path);
    ::close(fd);
    return status;
  }
  if (::chmod(path.c_str(), mode) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    absl::Status status = Errno("chmod/listen", path);
    ::close(fd);
    ::unlink(path.c_str());
    return status;
  }
  const int wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    absl::Status status = Errno("eventfd for", path);
    ::close(fd);
    ::unlink(path.c_str());
    return status;
  }
  return std::unique_ptr<UnixListener>(new UnixListener(path, fd, wake_fd));
}

UnixListener::UnixListener(std::string path, int fd, int wake_fd)
    : path_(std::move(path)), fd_(fd), wake_fd_(wake_fd) {}

UnixListener::~UnixListener() { Stop(); }

void UnixListener::Start(grpc::Server* server, UnixPeers* peers) {
  thread_ = std::thread([this, server, peers] { AcceptLoop(server, peers); });
}

void UnixListener::Stop() {
  if (stopped_) return;
  stopped_ = true;
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0)
    LogWarning("waking the accept loop: %s", strerror(errno));
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
  ::close(wake_fd_);
  ::unlink(path_.c_str());
}

void UnixListener::AcceptLoop(grpc::Server* server, UnixPeers* peers) {
  absl::Time last_warning = absl::InfinitePast();
  while (true) {
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LogError("accepting on %s stopped: poll: %s", path_, strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;  // Stop
    while (true) {
      const int connection = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (connection < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == EINTR || errno == ECONNABORTED) continue;
        // Out of descriptors (EMFILE, ENFILE) or memory: the connection waits in the backlog; try
        // again shortly instead of spinning, and say so at most once a second.
        if (absl::Now() - last_warning > absl::Seconds(1)) {
          LogWarning("accept on %s: %s (retrying)", path_, strerror(errno));
          last_warning = absl::Now();
        }
        pollfd wake = {wake_fd_, POLLIN, 0};
        if (::poll(&wake, 1, 100) > 0) return;
        break;
      }
      std::optional<UnixPeer> peer = PeerOf(connection);
      if (!peer.has_value()) {
        LogWarning("a connection to %s without peer credentials (SO_PEERCRED: %s): closed", path_,
                   strerror(errno));
        ::close(connection);
        continue;
      }
      peers->Record(connection, *std::move(peer));
      grpc::AddInsecureChannelFromFd(server, connection);  // gRPC owns it from here
    }
  }
}

}  // namespace probesidecar::server
