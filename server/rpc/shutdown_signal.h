// The signal that stops the server (SIGTERM, SIGINT) and who sent it, for the drain's log line:
// an operator reading why a sidecar stopped sees the sender (the supervisor, a person's kill, the
// container runtime, or the server itself after a lost CUDA context).
#pragma once

#include <signal.h>

#include <string>

namespace probesidecar::server {

// The signals that start a shutdown; RunServer blocks them in every thread, Serve waits for them.
sigset_t ShutdownSignals();

struct ShutdownSignal {
  int number = 0;
  // From the kernel's siginfo: si_code, and for a signal a process sent (kill, sigqueue, tkill)
  // its pid and real uid.
  int code = 0;
  pid_t pid = 0;
  uid_t uid = 0;
};

// Waits for one of ShutdownSignals() (blocked in the calling thread), retrying on EINTR.
ShutdownSignal WaitForShutdownSignal(const sigset_t& signals);

// "Terminated (from pid 4242 'supervisord', uid 0)": the signal's name and, where a process sent
// it, who; `self` is this process's pid, `sender_name` the sender's command name where it could
// be read (empty otherwise: the sender may be gone).
std::string DescribeShutdownSignal(const ShutdownSignal& signal, pid_t self,
                                   const std::string& sender_name);

// The command name of process `pid` (/proc/<pid>/comm), or "" when it cannot be read.
std::string ProcessName(pid_t pid);

}  // namespace probesidecar::server
