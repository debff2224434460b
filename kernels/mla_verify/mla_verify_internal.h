// Between the MLA verify launchers (mla_verify.cu, sm_90) and the sm_90a translation unit
// (mla_verify_sm90a.cu, compiled only for sm_90a). Not part of the public API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace probesidecar::kernels::mla {

struct KernelArgs;

// Raises the sm_90a kernels' dynamic shared-memory limits (once, at workspace creation) where the
// driver encodes tensor maps; *available says whether the kernels can run (its loads are TMA).
cudaError_t SetSm90aAttributes(bool* available);
// How a plan runs the sm_90a tile (from MlaVerifyPlan).
struct Sm90aOptions {
  bool one_page = false;        // the one-page schedule, else page pairs
  bool scores_under_pv = true;  // one page: the next page's scores issued under this page's P V
  bool kv_evict_first = true;   // the page loads' L2 policy: EVICT_FIRST, else EVICT_NORMAL
  bool kv_prefetch_l2 = false;  // page pairs: the next pair's pages prefetched into L2 at a pair's
                                // start
};
// The sm_90a tile kernel (split mode) on grid (64-row tiles, ranges), as a programmatic dependent
// of the plan kernel launched just before it.
cudaError_t LaunchTileSm90a(const KernelArgs& args, dim3 grid, const Sm90aOptions& options,
                            cudaStream_t stream);

}  // namespace probesidecar::kernels::mla
