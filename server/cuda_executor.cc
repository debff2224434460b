#include "server/cuda_executor.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace probesidecar::server {

absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const Config& config) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no CUDA device (", cudaGetErrorString(error), ")"));
  }
  if (config.device >= count) {
    return absl::UnavailableError(
        absl::StrCat("--device ", config.device, " but only ", count, " CUDA devices"));
  }
  return absl::UnimplementedError("the CUDA executor is not built yet");
}

}  // namespace probesidecar::server
