// Workspace: the device facts, kernel attributes and every scratch buffer, once per stream.
#include "kernels/probe_score/probe_score_workspace.h"

#include <new>

#include "kernels/blocks/device_support.h"
#include "kernels/blocks/tensor_map.h"
#include "kernels/probe_score/probe_score_fused_cuda.h"
#include "kernels/probe_score/probe_score_fused_tc.h"
#include "kernels/probe_score/probe_score_wgmma.h"

namespace probesidecar::kernels {
namespace {

using probe_score_detail::kFusedSmemLimit;
using probe_score_detail::kNumFusedPT;
using probe_score_detail::kNumTcConfigs;
using probe_score_detail::kTcConfigs;

// Device properties and the registers of each fused_cuda instantiation (its occupancy), read
// once here so that planning is arithmetic; raises the kernels' shared-memory limits on the way
// (of the fused_tc configurations that fit the device's blocks: the planner takes no other).
cudaError_t ReadDeviceFactsAndSetAttributes(int device, const DeviceFamily* limit_to_family,
                                            ProbeScoreDeviceFacts* facts) {
  DeviceLimits limits;
  cudaError_t err = ReadDeviceLimits(device, &limits);
  if (err != cudaSuccess) return err;
  if (limit_to_family != nullptr) limits = ClampToFamily(limits, *limit_to_family);
  *facts = ProbeScoreFactsFrom(limits);
  // The sm_90a warp-specialised tile reads W by TMA, through a tensor map the driver encodes.
  facts->gather_wgmma = Sm90aKernelsRunOn(facts->cc_major, facts->cc_minor, limit_to_family) &&
                        blocks::TensorMapEncoderAvailable();
  if (facts->gather_wgmma &&
      (err = probe_score_detail::SetGatherWgmmaAttributes()) != cudaSuccess) {
    return err;
  }
  if (facts->smem_per_block_optin < kFusedSmemLimit) return cudaErrorNotSupported;
  probe_score_detail::PrepareSplitKReduceLaunch();
  for (int d = 0; d < common::kNumDTypes; ++d) {
    const common::DType dtype = static_cast<common::DType>(d);
    for (int i = 0; i < kNumFusedPT; ++i) {
      const void* fn = probe_score_detail::FusedCudaKernelFn(dtype, i);
      if ((err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      kFusedSmemLimit)) != cudaSuccess) {
        return err;
      }
      cudaFuncAttributes attr{};
      if ((err = cudaFuncGetAttributes(&attr, fn)) != cudaSuccess) return err;
      facts->fused_cuda_regs[d][i] = attr.numRegs;
    }
    for (int c = 0; c < kNumTcConfigs; ++c) {
      for (int terms : {1, 3}) {
        const void* fn = probe_score_detail::FusedTcKernelFn(dtype, c, terms);
        if (fn == nullptr || !TcConfigFits(c, terms, *facts)) continue;
        if ((err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        probe_score_detail::TcSmemBytes(kTcConfigs[c], terms))) !=
            cudaSuccess) {
          return err;
        }
      }
    }
  }
  return cudaSuccess;
}

// Carves the buffers out of one allocation, in the order of the struct.
cudaError_t AllocateBuffers(ProbeScoreWorkspace* ws) {
  const ProbeScoreWorkspaceLimits& l = ws->resources.workspace;
  const size_t counters_bytes = static_cast<size_t>(l.counters) * sizeof(int32_t);
  const size_t total = static_cast<size_t>(l.cublas_workspace_bytes + l.partial_floats * 4 +
                                           l.staging_x_bytes + l.staging_c_bytes) +
                       counters_bytes;
  cudaError_t err = cudaMalloc(&ws->storage, total);
  if (err != cudaSuccess) {
    ws->storage = nullptr;
    return err;
  }
  char* p = static_cast<char*>(ws->storage);
  ws->cublas_ws = p;
  p += l.cublas_workspace_bytes;
  ws->partial = reinterpret_cast<float*>(p);
  p += l.partial_floats * 4;
  ws->counters = reinterpret_cast<int32_t*>(p);
  p += counters_bytes;
  ws->staging_x = p;
  p += l.staging_x_bytes;
  ws->staging_c = reinterpret_cast<float*>(p);
  if ((err = cudaMemset(ws->counters, 0, counters_bytes)) != cudaSuccess) return err;
  return cudaDeviceSynchronize();
}

}  // namespace

cudaError_t FromCublas(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return cudaSuccess;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return cudaErrorInitializationError;
    case CUBLAS_STATUS_INVALID_VALUE:
      return cudaErrorInvalidValue;
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return cudaErrorNotSupported;
    default:
      return cudaErrorUnknown;
  }
}

cudaError_t CreateProbeScoreWorkspace(const ProbeScoreWorkspaceConfig& config, cudaStream_t stream,
                                      ProbeScoreWorkspace** out) {
  if (out == nullptr || config.max_rows < 1 || config.max_hidden < 1 || config.max_probes < 1) {
    return cudaErrorInvalidValue;
  }
  *out = nullptr;
  auto* ws = new (std::nothrow) ProbeScoreWorkspace();
  if (ws == nullptr) return cudaErrorMemoryAllocation;
  ws->stream = stream;
  auto fail = [&](cudaError_t e) {
    DestroyProbeScoreWorkspace(ws);  // the first error is the one to report
    return e;
  };
  cudaError_t err = cudaGetDevice(&ws->device);
  if (err != cudaSuccess) return fail(err);
  if ((err = ReadDeviceFactsAndSetAttributes(ws->device, config.limit_to_family,
                                             &ws->resources.device)) != cudaSuccess) {
    return fail(err);
  }
  ws->resources.workspace = ProbeScoreWorkspaceLimitsFor(config);
  if ((err = AllocateBuffers(ws)) != cudaSuccess) return fail(err);

  cublasStatus_t st = cublasCreate(&ws->cublas);
  if (st != CUBLAS_STATUS_SUCCESS) {
    ws->cublas = nullptr;
    return fail(FromCublas(st));
  }
  // No TF32: fp32 activations must stay within 1e-5 of the float64 reference.
  if ((st = cublasSetMathMode(ws->cublas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
    return fail(FromCublas(st));
  }
  // The handle's stream and scratch, once: every GEMM runs on the workspace's stream, and with
  // the workspace's own scratch cuBLAS allocates nothing (also inside a captured graph).
  // cublasSetStream resets the scratch to cuBLAS's pool, so the scratch is set after it.
  if ((st = cublasSetStream(ws->cublas, stream)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasSetWorkspace(
           ws->cublas, ws->cublas_ws,
           static_cast<size_t>(ws->resources.workspace.cublas_workspace_bytes))) !=
          CUBLAS_STATUS_SUCCESS) {
    return fail(FromCublas(st));
  }
  *out = ws;
  return cudaSuccess;
}

cudaError_t DestroyProbeScoreWorkspace(ProbeScoreWorkspace* workspace) {
  if (workspace == nullptr) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  if (workspace->cublas != nullptr) err = FromCublas(cublasDestroy(workspace->cublas));
  if (workspace->storage != nullptr) {
    const cudaError_t freed = cudaFree(workspace->storage);
    if (err == cudaSuccess) err = freed;
  }
  delete workspace;
  return err;
}

const ProbeScoreResources& ProbeScoreWorkspaceResources(const ProbeScoreWorkspace& workspace) {
  return workspace.resources;
}

}  // namespace probesidecar::kernels
