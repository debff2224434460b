#include "server/executors/make_executor.h"

#include "absl/strings/str_cat.h"
#include "server/executors/cpu/cpu_executor.h"
#include "server/executors/cuda/cuda_executor.h"
#include "server/executors/fault_injection.h"
#include "server/observability/log.h"

namespace probesidecar::server {
namespace {

absl::StatusOr<std::unique_ptr<Executor>> MakeBackend(const Config& config) {
  if (config.backend != Backend::kCpu) {
    absl::StatusOr<std::unique_ptr<Executor>> cuda = CreateCudaExecutor(config);
    if (cuda.ok()) return cuda;
    // A GPU this build holds no code for (FAILED_PRECONDITION) stops `auto` too: serving it on
    // the CPU would fail its first GPU request instead of the start.
    if (config.backend == Backend::kCuda ||
        cuda.status().code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend ", config.backend == Backend::kCuda ? "cuda" : "auto", ": ",
                       cuda.status().message()));
    }
    LogInfo("backend auto: using the CPU backend (%s)", cuda.status().message());
  }
  return std::unique_ptr<Executor>(
      std::make_unique<CpuExecutor>(config.cpu_threads, config.max_queued_requests));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const Config& config) {
  absl::StatusOr<std::unique_ptr<Executor>> executor = MakeBackend(config);
  if (!executor.ok()) return executor;
  if (const uint64_t every = FaultEveryFromEnvironment(); every > 0) {
    return InjectFaults(std::move(*executor), every);
  }
  return executor;
}

}  // namespace probesidecar::server
