// Who stopped the server, as the drain's log line says it: a real signal sent to this thread
// (kill from this process, and from a child process), and siginfo as the kernel fills it for the
// other senders.
#include "server/rpc/shutdown_signal.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace probesidecar::server {
namespace {

// Blocks the shutdown signals in this thread for a test's lifetime (as RunServer does).
class Blocked {
 public:
  Blocked() : signals_(ShutdownSignals()) { pthread_sigmask(SIG_BLOCK, &signals_, &old_); }
  ~Blocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  const sigset_t& signals() const { return signals_; }

 private:
  sigset_t signals_;
  sigset_t old_;
};

TEST(ShutdownSignal, AKillFromThisProcessIsNamedSo) {
  Blocked blocked;
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  const ShutdownSignal got = WaitForShutdownSignal(blocked.signals());
  EXPECT_EQ(got.number, SIGTERM);
  EXPECT_EQ(got.pid, getpid());
  EXPECT_EQ(got.uid, getuid());
  EXPECT_EQ(DescribeShutdownSignal(got, getpid(), "ignored"),
            std::string(strsignal(SIGTERM)) + " (from this process)");
}

TEST(ShutdownSignal, AKillFromAnotherProcessNamesItsPidAndUid) {
  Blocked blocked;
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(kill(parent, SIGINT) == 0 ? 0 : 1);
  const ShutdownSignal got = WaitForShutdownSignal(blocked.signals());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(got.number, SIGINT);
  EXPECT_EQ(got.pid, child);
  EXPECT_EQ(DescribeShutdownSignal(got, parent, "supervisord"),
            std::string(strsignal(SIGINT)) + " (from pid " + std::to_string(child) +
                " 'supervisord', uid " + std::to_string(getuid()) + ")");
  EXPECT_EQ(DescribeShutdownSignal(got, parent, ""),
            std::string(strsignal(SIGINT)) + " (from pid " + std::to_string(child) + ", uid " +
                std::to_string(getuid()) + ")");
}

TEST(ShutdownSignal, NoSenderIsClaimedWhereTheKernelSentIt) {
  ShutdownSignal kernel{SIGTERM, SI_KERNEL, 0, 0};
  EXPECT_EQ(DescribeShutdownSignal(kernel, getpid(), ""),
            std::string(strsignal(SIGTERM)) + " (from the kernel)");
  ShutdownSignal timer{SIGTERM, SI_TIMER, 77, 0};  // si_pid means nothing here
  EXPECT_EQ(DescribeShutdownSignal(timer, getpid(), ""), strsignal(SIGTERM));
}

TEST(ShutdownSignal, ProcessNameReadsProcComm) {
  EXPECT_EQ(ProcessName(getpid()), "shutdown_signal");  // comm: the first 15 characters
  EXPECT_EQ(ProcessName(-1), "");
}

}  // namespace
}  // namespace probesidecar::server
