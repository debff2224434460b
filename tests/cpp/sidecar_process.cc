#include "tests/cpp/sidecar_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/status/statusor.h"
#include "client/cpp/client.h"

namespace probesidecar::testing {
namespace {

// The service name the server reports in grpc.health.v1 (server/rpc/server.cc).
constexpr char kServiceName[] = "probesidecar.v1.ProbeSidecar";

}  // namespace

SidecarProcess::SidecarProcess(std::vector<std::string> extra_flags)
    : flags_(std::move(extra_flags)) {
  char tmpl[] = "/tmp/probe-sidecar-cpp-XXXXXX";
  dir_ = mkdtemp(tmpl);
  socket_path_ = dir_ + "/sidecar.sock";
  log_path_ = dir_ + "/sidecar.log";
}

SidecarProcess::~SidecarProcess() {
  if (pid_ > 0) Stop(SIGKILL);
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

bool SidecarProcess::Start(std::string* error) {
  const char* bin = std::getenv("PROBE_SIDECAR_BIN");
  const std::string binary = bin != nullptr ? bin : "probe-sidecar";
  std::vector<std::string> args = {binary, "--listen=unix:" + socket_path_, "--listen=127.0.0.1:0",
                                   "--metrics-listen=none"};
  args.insert(args.end(), flags_.begin(), flags_.end());
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  // Ready when the service's gRPC health status is SERVING (the server sets it once every
  // listener is up); its TCP port is then the one ServerInfo reports. The deadline is a safety
  // net for a server that never comes up, far past any start (a sanitized build on a busy
  // machine included), not a measurement.
  client::ClientOptions options;
  options.timeout_seconds = 10;
  client::Client probe(uds_target(), options);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
  while (std::chrono::steady_clock::now() < deadline && Running()) {
    const absl::StatusOr<std::string> health = probe.Health(kServiceName);
    if (health.ok() && *health == "SERVING") {
      const absl::StatusOr<v1::ServerInfoResponse> info = probe.ServerInfo();
      if (!info.ok()) {
        *error = "probe-sidecar is serving but ServerInfo failed: " + info.status().ToString();
        return false;
      }
      for (const std::string& address : info->listen()) {
        if (address.rfind("unix:", 0) != 0) tcp_target_ = address;
      }
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *error = "probe-sidecar did not start:\n" + Log();
  return false;
}

bool SidecarProcess::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == 0) return true;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  pid_ = -1;
  return false;
}

int SidecarProcess::Stop(int signal_number) {
  if (pid_ <= 0) return exit_code_;
  kill(pid_, signal_number);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return exit_code_;
}

std::string SidecarProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace probesidecar::testing
