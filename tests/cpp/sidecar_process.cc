#include "tests/cpp/sidecar_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace probesidecar::testing {

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
  std::vector<std::string> args = {binary, "--listen=unix:" + socket_path_,
                                   "--listen=127.0.0.1:0", "--metrics-listen=none"};
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
  const std::regex ready(R"(serving on .*127\.0\.0\.1:(\d+))");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    std::smatch match;
    const std::string log = Log();
    if (std::regex_search(log, match, ready)) {
      tcp_target_ = "127.0.0.1:" + match[1].str();
      return true;
    }
    if (!Running()) break;
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
