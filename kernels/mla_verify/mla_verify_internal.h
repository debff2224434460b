// Between the MLA verify launchers (mla_verify.cu, sm_90) and the sm_90a translation unit
// (mla_verify_sm90a.cu, compiled only for sm_90a). Not part of the public API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/mla_verify/mla_verify.h"

namespace probesidecar::kernels::mla {

struct KernelArgs;

// Raises the sm_90a kernels' dynamic shared-memory limits (once, at workspace creation) where the
// driver encodes tensor maps; *available says whether the kernels can run (its loads are TMA).
cudaError_t SetSm90aAttributes(bool* available);
// The sm_90a tile kernel (split mode) of a schedule (never kAuto) on grid (row tiles, ranges), as a
// programmatic dependent of the kernel launched just before it (the plan kernel, unless
// args.plan_store asks the blocks to plan themselves). kSwapAb needs s_q * h_q of 16
// or 32 (mla::SwapAbFits) and one row tile; anything else is cudaErrorInvalidValue.
cudaError_t LaunchTileSm90a(const KernelArgs& args, dim3 grid, MlaVerifySm90aSchedule schedule,
                            cudaStream_t stream);

}  // namespace probesidecar::kernels::mla
