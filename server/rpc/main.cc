// probe-sidecar: the service binary. Its flags are documented in --help (server/config/config.cc).
#include <cstdio>

#include "server/config/config.h"
#include "server/config/version.h"
#include "server/rpc/server.h"

int main(int argc, char** argv) {
  using probesidecar::server::ParseFlags;
  absl::StatusOr<probesidecar::server::ParsedFlags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "probe-sidecar: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (parsed->show_help) {
    std::fputs(probesidecar::server::HelpText().c_str(), stdout);
    return 0;
  }
  if (parsed->show_version) {
    std::printf("probe-sidecar %s (git %s, CUDA runtime %s)\n", probesidecar::server::kVersion,
                probesidecar::server::kGitCommit, probesidecar::server::kCudaRuntime);
    return 0;
  }
  return probesidecar::server::RunServer(parsed->config);
}
