// CUDA errors as absl::Status (INTERNAL, naming the call), for the CUDA executor's files.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace probesidecar::server {

inline absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

}  // namespace probesidecar::server

#define PS_RETURN_IF_CUDA(call)                                                      \
  do {                                                                               \
    if (absl::Status _ps_status = ::probesidecar::server::CudaStatus((call), #call); \
        !_ps_status.ok())                                                            \
      return _ps_status;                                                             \
  } while (0)
