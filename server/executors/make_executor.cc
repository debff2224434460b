#include "server/executors/make_executor.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "server/executors/cpu/cpu_executor.h"
#include "server/executors/cuda/cuda_executor.h"
#include "server/observability/log.h"

namespace probesidecar::server {

absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const Config& config) {
  if (config.backend != Backend::kCpu) {
    absl::StatusOr<std::unique_ptr<Executor>> cuda = CreateCudaExecutor(config);
    if (cuda.ok()) return cuda;
    if (config.backend == Backend::kCuda) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend cuda: ", cuda.status().message()));
    }
    LogInfo("backend auto: using the CPU backend (%s)", cuda.status().message());
  }
  // The service admits at most --max-concurrent-requests requests; each is split into tasks of
  // ~2M multiply-adds, so the task queue itself needs no bound of its own.
  return std::unique_ptr<Executor>(
      std::make_unique<CpuExecutor>(config.cpu_threads, std::numeric_limits<size_t>::max()));
}

}  // namespace probesidecar::server
