#include "server/rpc/shutdown_signal.h"

#include <errno.h>
#include <string.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace probesidecar::server {

sigset_t ShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

ShutdownSignal WaitForShutdownSignal(const sigset_t& signals) {
  siginfo_t info{};
  int number = -1;
  while ((number = sigwaitinfo(&signals, &info)) < 0 && errno == EINTR) {
  }
  ShutdownSignal signal;
  signal.number = number < 0 ? SIGTERM : number;  // no other error is possible with a valid set
  signal.code = info.si_code;
  signal.pid = info.si_pid;
  signal.uid = info.si_uid;
  return signal;
}

std::string DescribeShutdownSignal(const ShutdownSignal& signal, pid_t self,
                                   const std::string& sender_name) {
  const std::string name = strsignal(signal.number);
  // Sent by a process (kill(2), sigqueue(3), tgkill(2)): si_pid and si_uid are set.
  const bool from_process =
      signal.code == SI_USER || signal.code == SI_QUEUE || signal.code == SI_TKILL;
  if (!from_process) {
    return signal.code == SI_KERNEL ? absl::StrCat(name, " (from the kernel)") : name;
  }
  if (signal.pid == self) return absl::StrCat(name, " (from this process)");
  return absl::StrFormat("%s (from pid %d%s, uid %d)", name, signal.pid,
                         sender_name.empty() ? "" : absl::StrCat(" '", sender_name, "'"),
                         signal.uid);
}

std::string ProcessName(pid_t pid) {
  std::ifstream comm(absl::StrCat("/proc/", pid, "/comm"));
  std::string name;
  if (!comm || !std::getline(comm, name)) return "";
  return name;
}

}  // namespace probesidecar::server
