#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/blocks/launch.cuh"
#include "kernels/probe_outcomes/probe_outcomes.h"
#include "kernels/probe_outcomes/probe_outcomes_kernel.cuh"

namespace probesidecar::kernels {

using probe_outcomes_detail::CountProbeOutcomesKernel;
using probe_outcomes_detail::CountSharedBytes;
using probe_outcomes_detail::kMaxBlocks;
using probe_outcomes_detail::kMaxThreads;
using probe_outcomes_detail::kNarrowThreads;
using probe_outcomes_detail::kNarrowTile;
using probe_outcomes_detail::kTileProbes;
using probe_outcomes_detail::kUnroll;

cudaError_t LaunchCountProbeOutcomes(const CountProbeOutcomesParams& params, cudaStream_t stream,
                                     OutcomeLaunch launch) {
  if (params.descriptor == nullptr || params.thresholds == nullptr || params.scratch == nullptr ||
      params.non_finite_total == nullptr || params.request_non_finite == nullptr ||
      params.num_probes <= 0 || params.bucket <= 0 || params.num_bounds < 0 ||
      params.num_bounds > kMaxScoreBounds || (params.num_bounds > 0 && params.bounds == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int tile_width = std::min(params.num_probes, kTileProbes);
  const int tiles = (params.num_probes + kTileProbes - 1) / kTileProbes;
  // Whole rows of the tile per pass, no more rows than the bucket holds.
  const int threads = tile_width <= kNarrowTile ? kNarrowThreads : kMaxThreads;
  const int rows_per_pass = std::max(1, std::min(threads / tile_width, params.bucket));
  const int passes = (params.bucket + rows_per_pass - 1) / rows_per_pass;
  // Each thread counts kUnroll rows at least (loads in flight), within kMaxBlocks blocks.
  const int row_groups =
      std::max(1, std::min((passes + kUnroll - 1) / kUnroll, std::max(1, kMaxBlocks / tiles)));
  const dim3 grid(row_groups, tiles), block(tile_width * rows_per_pass);
  const size_t shared = CountSharedBytes(static_cast<int>(block.x), tile_width, params.num_bounds);
  if (launch == OutcomeLaunch::kProgrammatic) {
    const cudaError_t e = blocks::LaunchProgrammaticDependent(CountProbeOutcomesKernel, grid, block,
                                                              shared, stream, params);
    return e != cudaSuccess ? e : cudaGetLastError();
  }
  CountProbeOutcomesKernel<<<grid, block, shared, stream>>>(params);
  return cudaGetLastError();
}

bool CountCanFollowProgrammatically() {
  return blocks::ProgrammaticLaunchUsable(reinterpret_cast<const void*>(CountProbeOutcomesKernel));
}

cudaError_t CreateProbeOutcomeTables(const float* thresholds, const float* bounds,
                                     ProbeOutcomeLayout layout, ProbeOutcomeTables* out) {
  if (out == nullptr || thresholds == nullptr || !layout.Valid() ||
      (layout.num_bounds > 0 && bounds == nullptr)) {
    return cudaErrorInvalidValue;
  }
  *out = ProbeOutcomeTables{};
  std::vector<float> host(thresholds, thresholds + layout.num_probes);
  host.insert(host.end(), bounds, bounds + layout.num_bounds);
  void* storage = nullptr;
  if (cudaError_t e = cudaMalloc(&storage, sizeof(float) * host.size()); e != cudaSuccess) {
    return e;
  }
  if (cudaError_t e =
          cudaMemcpy(storage, host.data(), sizeof(float) * host.size(), cudaMemcpyHostToDevice);
      e != cudaSuccess) {
    cudaFree(storage);
    return e;
  }
  out->storage = storage;
  out->thresholds = static_cast<const float*>(storage);
  out->bounds = layout.num_bounds > 0 ? out->thresholds + layout.num_probes : nullptr;
  return cudaSuccess;
}

cudaError_t DestroyProbeOutcomeTables(ProbeOutcomeTables* tables) {
  if (tables == nullptr) return cudaSuccess;
  const cudaError_t e = tables->storage != nullptr ? cudaFree(tables->storage) : cudaSuccess;
  *tables = ProbeOutcomeTables{};
  return e;
}

cudaError_t CreateProbeOutcomeCounters(ProbeOutcomeLayout layout, cudaStream_t stream,
                                       unsigned long long** out) {
  if (out == nullptr || !layout.Valid()) return cudaErrorInvalidValue;
  *out = nullptr;
  const size_t bytes = sizeof(unsigned long long) * static_cast<size_t>(layout.SlotWords());
  void* counters = nullptr;
  if (cudaError_t e = cudaMalloc(&counters, bytes); e != cudaSuccess) return e;
  if (cudaError_t e = cudaMemsetAsync(counters, 0, bytes, stream); e != cudaSuccess) {
    cudaFree(counters);
    return e;
  }
  *out = static_cast<unsigned long long*>(counters);
  return cudaSuccess;
}

}  // namespace probesidecar::kernels
