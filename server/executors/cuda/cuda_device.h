// What a CUDA executor learns of its device before it starts: the checks that refuse a device at
// start-up rather than at its first request, and what the executor reports of it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace probesidecar::server {

struct CudaDeviceFacts {
  std::string name;                       // cudaDeviceProp::name
  std::string compute_capability;         // "major.minor"
  std::vector<std::string> kernel_paths;  // what this build runs there
  bool mps = false;                       // the context is an MPS client
};

// UNAVAILABLE when `device` is not there, FAILED_PRECONDITION when this build holds no code for
// it; logs what it found (and what MPS or its absence means for the inference server beside it).
absl::StatusOr<CudaDeviceFacts> ReadCudaDevice(int device);

}  // namespace probesidecar::server
