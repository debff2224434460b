// Between the MLA verify launchers (mla_verify.cu, sm_90) and the sm_90a translation unit
// (mla_verify_sm90a.cu, compiled only for sm_90a). Not part of the public API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace probesidecar::kernels::mla {

struct KernelArgs;

// Whether this build holds the sm_90a kernels (CUTLASS/CuTe headers were found).
bool Sm90aCompiled();
// Raises the dynamic shared-memory limit of the sm_90a kernels and looks up the driver's
// tensor-map encoder (once, at workspace creation); *tma_available says whether it was found.
cudaError_t SetSm90aAttributes(bool* tma_available);
// The sm_90a tile kernel: grid (64-row tiles, grid_y), split or baseline mode, keys by TMA
// (tma) or by cp.async.
cudaError_t LaunchTileSm90a(const KernelArgs& args, int32_t grid_y, bool split, bool tma,
                            cudaStream_t stream);

}  // namespace probesidecar::kernels::mla
