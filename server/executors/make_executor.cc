#include "server/executors/make_executor.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/executors/cpu/cpu_executor.h"
#include "server/executors/cuda/cuda_executor.h"
#include "server/executors/multi_device_executor.h"
#include "server/observability/log.h"
#include "server/observability/outcome_labels.h"

namespace probesidecar::server {
namespace {

// One executor per device of --devices (all: every device the process sees); the device's own
// executor alone when there is one, so that one device is served exactly as before. Every device
// is tried: UNAVAILABLE (naming each device's reason) only when none is usable, FAILED_PRECONDITION
// when some are and others are not, or when a device has no code in this build.
absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutors(const Config& config,
                                                              const CudaExecutorFactory& cuda) {
  // No device at all (or no driver): one reason, not one per listed device.
  absl::StatusOr<int> count = cuda.device_count();
  if (!count.ok()) return count.status();
  std::vector<int> devices = config.devices;
  if (config.all_devices) {
    devices.clear();
    for (int d = 0; d < *count; ++d) devices.push_back(d);
  }
  std::vector<std::unique_ptr<Executor>> executors;
  std::vector<int> usable;
  std::vector<std::string> failures;
  for (int device : devices) {
    Config one = config;
    one.all_devices = false;
    one.devices = {device};
    one.device = device;
    absl::StatusOr<std::unique_ptr<Executor>> executor = cuda.create(one);
    if (!executor.ok()) {
      if (executor.status().code() == absl::StatusCode::kFailedPrecondition) {
        return executor.status();
      }
      failures.push_back(absl::StrCat("device ", device, ": ", executor.status().message()));
      continue;
    }
    usable.push_back(device);
    executors.push_back(std::move(*executor));
  }
  if (!failures.empty()) {
    const std::string why = absl::StrJoin(failures, "; ");
    if (usable.empty()) return absl::UnavailableError(why);
    return absl::FailedPreconditionError(absl::StrCat(
        why, " (device", usable.size() == 1 ? " " : "s ", absl::StrJoin(usable, ", "),
        " usable): every device of --devices must be usable; list only those to serve them"));
  }
  if (executors.size() == 1) return std::move(executors.front());
  LogInfo("serving CUDA devices %s: one executor each (%d stream slots per device)",
          absl::StrJoin(devices, ", "), config.cuda_workers);
  return std::unique_ptr<Executor>(
      std::make_unique<MultiDeviceExecutor>(std::move(devices), std::move(executors)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const Config& config,
                                                       const CudaExecutorFactory& cuda) {
  if (config.backend != Backend::kCpu) {
    absl::StatusOr<std::unique_ptr<Executor>> made = CreateCudaExecutors(config, cuda);
    if (made.ok()) return made;
    // FAILED_PRECONDITION stops `auto` too: a GPU this build holds no code for, or some devices
    // unusable. Serving on the CPU then would fail the first GPU request instead of the start.
    if (config.backend == Backend::kCuda ||
        made.status().code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend ", config.backend == Backend::kCuda ? "cuda" : "auto", ": ",
                       made.status().message()));
    }
    LogInfo("backend auto: using the CPU backend (%s)", made.status().message());
  }
  return std::unique_ptr<Executor>(
      std::make_unique<CpuExecutor>(config.cpu_threads, config.max_queued_requests,
                                    OutcomeLabels::SlotsFor(config.max_session_label_sets)));
}

absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const Config& config) {
  return MakeExecutor(config, {.device_count = &CudaDeviceCount, .create = &CreateCudaExecutor});
}

}  // namespace probesidecar::server
