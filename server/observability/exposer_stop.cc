#include "server/observability/exposer_stop.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace probesidecar::server {
namespace {

// Where a client reaches a listener bound to `host`: the loopback for the wildcards.
std::string ConnectHost(std::string host) {
  absl::string_view h = host;
  if (absl::ConsumePrefix(&h, "[")) absl::ConsumeSuffix(&h, "]");
  if (h == "0.0.0.0" || h.empty()) return "127.0.0.1";
  if (h == "::") return "::1";
  return std::string(h);
}

// Opens a TCP connection to `address` and closes it again, waiting at most 50 ms.
void Poke(const addrinfo& address) {
  const int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                          address.ai_protocol);
  if (fd < 0) return;
  if (::connect(fd, address.ai_addr, address.ai_addrlen) != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, 50);
  }
  ::close(fd);
}

}  // namespace

void StopExposer(std::unique_ptr<prometheus::Exposer> exposer, const std::string& host) {
  if (exposer == nullptr) return;
  const std::vector<int> ports = exposer->GetListeningPorts();
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (ports.empty() || ::getaddrinfo(ConnectHost(host).c_str(),
                                     std::to_string(ports.front()).c_str(), &hints, &found) != 0) {
    found = nullptr;
  }
  std::atomic<bool> stopped{false};
  // A connection made before civetweb sees its stop flag is served (it reads EOF and closes); the
  // first one after wakes the listener thread, which then exits.
  std::thread waker([&stopped, found] {
    while (found != nullptr && !stopped.load()) {
      // Every address the host resolves to ("localhost": ::1 and 127.0.0.1), one of which it
      // listens on.
      for (const addrinfo* a = found; a != nullptr; a = a->ai_next) Poke(*a);
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  exposer.reset();
  stopped.store(true);
  waker.join();
  if (found != nullptr) ::freeaddrinfo(found);
}

}  // namespace probesidecar::server
