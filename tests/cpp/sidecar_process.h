// Starts the real probe-sidecar binary for a test: a temporary Unix socket and a free loopback
// port, its log in a temporary file.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace probesidecar::testing {

class SidecarProcess {
 public:
  // extra_flags are appended to the listeners this class chooses.
  explicit SidecarProcess(std::vector<std::string> extra_flags = {});
  ~SidecarProcess();
  SidecarProcess(const SidecarProcess&) = delete;
  SidecarProcess& operator=(const SidecarProcess&) = delete;

  // Waits until the server's gRPC health status is SERVING; false (with the log in *error) if
  // it exits first or never gets there.
  bool Start(std::string* error);
  // Sends a signal and waits; returns the exit code (-1 if killed by a signal).
  int Stop(int signal_number);

  std::string uds_target() const { return "unix:" + socket_path_; }
  const std::string& tcp_target() const { return tcp_target_; }
  const std::string& dir() const { return dir_; }
  std::string Log() const;
  bool Running();

 private:
  std::vector<std::string> flags_;
  std::string dir_;
  std::string socket_path_;
  std::string log_path_;
  std::string tcp_target_;
  pid_t pid_ = -1;
  int exit_code_ = -1;
};

}  // namespace probesidecar::testing
