#include "server/executors/make_executor.h"

#include "absl/strings/str_cat.h"
#include "server/executors/cpu/cpu_executor.h"
#include "server/executors/cuda/cuda_executor.h"
#include "server/observability/log.h"

namespace probesidecar::server {
namespace {

absl::StatusOr<std::unique_ptr<Executor>> MakeBackend(const Config& config) {
  if (config.backend != Backend::kCpu) {
    absl::StatusOr<std::unique_ptr<Executor>> cuda = CreateCudaExecutor(config);
    if (cuda.ok()) return cuda;
    if (config.backend == Backend::kCuda) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend cuda: ", cuda.status().message()));
    }
    LogInfo("backend auto: using the CPU backend (%s)", cuda.status().message());
  }
  return std::unique_ptr<Executor>(
      std::make_unique<CpuExecutor>(config.cpu_threads, config.max_queued_requests));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const Config& config) {
  return MakeBackend(config);
}

}  // namespace probesidecar::server
