// The per-stream workspace behind the opaque ProbeScoreWorkspace of probe_score.h: the device
// facts and buffer limits read or derived once at creation, a cuBLAS handle, and one device
// allocation for every scratch buffer. Internal to kernels/probe_score.
#pragma once

#include <cublas_v2.h>

#include "kernels/probe_score/probe_score.h"

namespace probesidecar::kernels {

struct ProbeScoreWorkspace {
  int device = 0;
  cudaStream_t stream = nullptr;  // the one stream it serves (its cuBLAS handle runs there)
  ProbeScoreResources resources;  // device facts and the buffers' limits below

  cublasHandle_t cublas = nullptr;
  void* storage = nullptr;      // the one allocation behind the buffers below
  void* cublas_ws = nullptr;    // [resources.workspace.cublas_workspace_bytes] bytes
  float* partial = nullptr;     // [resources.workspace.partial_floats]
  int32_t* counters = nullptr;  // [resources.workspace.counters], zero between launches
  void* staging_x = nullptr;    // [resources.workspace.staging_x_bytes] bytes
  float* staging_c = nullptr;   // [resources.workspace.staging_c_bytes] bytes
};

// cuBLAS's status as the closest cudaError_t.
cudaError_t FromCublas(cublasStatus_t status);

}  // namespace probesidecar::kernels
