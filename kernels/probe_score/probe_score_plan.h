// Host-side planning of probe scoring: which path runs a shape (the dispatcher), and how it is
// launched (the plan). Plain C++ (CUDA headers only for cudaError_t): CPU tests cover it, and it
// never touches the device. A plan is computed once, when a graph is captured or a benchmark sets
// up; LaunchProbeScore (probe_score.h) then only does pointer math and launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "kernels/blocks/device_family.h"
#include "kernels/probe_score/probe_score_config.h"
#include "kernels/probe_score/probe_score_precision.h"

namespace probesidecar::kernels {

// Values are stable (new paths are appended): the names are used in metrics and results.
enum class ProbeScorePath : int32_t {
  kFusedCuda = 0,        // CUDA cores; each selected row read once; few probes
  kFusedTensorCore = 1,  // gather fused into a tensor-core GEMM (bf16/fp16 only)
  kGatherGemm = 2,       // gather into a staging buffer, then cuBLAS
  kGatherWgmma = 3,      // gather fused into a wgmma GEMM (sm_90a, bf16/fp16 only)
};
inline constexpr int kNumProbeScorePaths = 4;

// "fused_cuda", "fused_tc", "gather_gemm", "gather_wgmma" (the names used in metrics and
// benchmarks).
const char* ProbeScorePathName(ProbeScorePath path);

// The launch shape of a plan (and of one captured graph).
struct ProbeScoreShape {
  common::DType dtype = common::DType::kBFloat16;  // of the activations
  int32_t max_rows = 0;    // the row bucket: grids are sized for this many rows
  int32_t num_probes = 0;  // P
  int32_t hidden = 0;      // H
  // Of the probe set's weights (ProbeWeights::precision): exact triples the tensor-core work.
  ProbePrecision precision = ProbePrecision::kFast;
};

// What planning needs to know about the device: read once, when a workspace is created.
struct ProbeScoreDeviceFacts {
  int32_t cc_major = 0, cc_minor = 0;  // compute capability (arch-specific paths key on it)
  bool gather_wgmma = false;           // compute capability 9.0, the sm_90a kernels in this
                                       // build, and the driver encodes tensor maps
  int32_t num_sms = 0;
  int64_t smem_per_sm = 0;              // bytes
  int64_t smem_per_block_optin = 0;     // bytes a block may have: tile configurations beyond it
                                        // are never planned (sm_86/89/120: 99 KB; sm_90: 227 KB)
  int64_t reserved_smem_per_block = 0;  // bytes
  int32_t max_threads_per_sm = 2048;
  int32_t regs_per_sm = 65536;
  // Registers per thread of each fused_cuda instantiation, [dtype][kFusedPTValues index]: the
  // occupancy that sizes its grid (0: unknown, occupancy then bounded by threads and smem only).
  int32_t fused_cuda_regs[common::kNumDTypes][probe_score_detail::kNumFusedPT] = {};
};

// The sizes a workspace is created for.
struct ProbeScoreWorkspaceConfig {
  int32_t max_rows = 8192;    // the largest max_rows any plan for this workspace uses
  int32_t max_hidden = 8192;  // the largest H
  int32_t max_probes = 4096;  // the largest P
  // Tests and benchmarks only: plan as for a device of this family (ClampToFamily: its shared
  // memory and thread limits, no gather_wgmma off sm_90) on the GPU in hand. nullptr: the device.
  const DeviceFamily* limit_to_family = nullptr;
};

// The capacities of a workspace's buffers (a pure function of its config): every plan fits them.
struct ProbeScoreWorkspaceLimits {
  int32_t max_rows = 0, max_hidden = 0, max_probes = 0;  // the config's
  int64_t partial_floats = 0;          // split-K partial sums (fused_cuda, fused_tc), floats
  int32_t counters = 0;                // split-K tile counters of fused_cuda
  int64_t staging_x_bytes = 0;         // gather_gemm: gathered rows
  int64_t staging_c_bytes = 0;         // gather_gemm: fp32 GEMM result
  int64_t cublas_workspace_bytes = 0;  // cuBLAS's own scratch (no allocation inside a graph)
};
ProbeScoreWorkspaceLimits ProbeScoreWorkspaceLimitsFor(const ProbeScoreWorkspaceConfig& config);

// Everything a plan depends on besides the shape.
struct ProbeScoreResources {
  ProbeScoreDeviceFacts device;
  ProbeScoreWorkspaceLimits workspace;
};

// Overrides for the benchmark and tests; the defaults (all 0 / -1) let the planner decide.
struct ProbeScoreTuning {
  int32_t tc_config = -1;         // fused_tc tile configuration (kTcConfigs index)
  int32_t wgmma_config = -1;      // gather_wgmma tile configuration (kWgmmaConfigs index)
  int32_t splits = 0;             // K splits for fused_cuda / fused_tc (0: automatic)
  int32_t gather_chunk_rows = 0;  // gather_gemm rows per chunk (0: as few chunks as fit)
};

struct ProbeScoreGrid {
  uint32_t x = 0, y = 0, z = 0;
};

// fused_cuda: grid (row_groups, splits, probe_tiles), kFusedThreads threads.
struct FusedCudaPlan {
  int32_t pt_index = 0;     // probes per block pass: kFusedPTValues[pt_index]
  int32_t k_per_split = 0;  // elements of H per split
  int32_t k_per_smem = 0;   // elements of W held in shared memory at once
  int32_t smem_bytes = 0;   // dynamic shared memory
  ProbeScoreGrid grid;
};

// fused_tc and gather_wgmma: grid (n_tiles, m_tiles, splits), TcThreads(kTcConfigs[config])
// (resp. 128 x kWgmmaConfigs[config].wgs) threads; with splits > 1 a reduction kernel follows
// (reduce_grid x 256 threads).
struct FusedTcPlan {
  int32_t config = 0;        // kTcConfigs (resp. kWgmmaConfigs) index
  int32_t terms = 1;         // weight terms per A tile: 3 for exact precision
  int32_t k_tiles = 0;       // ceil(H / bk)
  int32_t partial_rows = 0;  // m_tiles * bm
  int32_t partial_ld = 0;    // n_tiles * bn, elements
  int32_t smem_bytes = 0;    // dynamic shared memory
  ProbeScoreGrid grid;
  ProbeScoreGrid reduce_grid;
};

// gather_gemm: per chunk of rows a gather kernel, one cuBLAS GEMM and an epilogue kernel.
struct GatherGemmPlan {
  int32_t chunk_rows = 0;
  int32_t num_chunks = 0;
  int32_t ldc = 0;    // elements per row of the fp32 GEMM result
  int32_t terms = 1;  // GEMMs per chunk, one per weight term (exact: 3, accumulated by cuBLAS)
};

// What a plan uses of the workspace (checked against its limits when planning and at launch).
struct ProbeScoreWorkspaceNeeds {
  int64_t partial_floats = 0;
  int32_t counters = 0;
  int64_t staging_x_bytes = 0;
  int64_t staging_c_bytes = 0;
};

struct ProbeScorePlan {
  ProbeScoreShape shape;
  ProbeScorePath path = ProbeScorePath::kFusedCuda;
  // The one of `path` is filled; with shape.max_rows == 0 none is (nothing is launched).
  FusedCudaPlan fused_cuda;
  FusedTcPlan fused_tc;
  GatherGemmPlan gather_gemm;
  FusedTcPlan gather_wgmma;
  ProbeScoreWorkspaceNeeds needs;
};

// The planner's view of a device from its limits (gather_wgmma and the register counts are the
// workspace's to fill: they depend on the build and its kernels).
ProbeScoreDeviceFacts ProbeScoreFactsFrom(const DeviceLimits& limits);

// Whether fused_tc configuration `config` with `terms` weight terms fits a block of this device.
bool TcConfigFits(int config, int terms, const ProbeScoreDeviceFacts& device);

// Whether `path` can run this shape on this device (fused_tc needs bf16/fp16 and H % 8 == 0).
bool ProbeScorePathSupports(ProbeScorePath path, const ProbeScoreShape& shape,
                            const ProbeScoreDeviceFacts& device);

// The dispatcher: the path for a shape on a device, from the crossovers measured by the
// benchmark (bench/results/probe_score.md). Always a supported path.
ProbeScorePath ChooseProbeScorePath(const ProbeScoreShape& shape,
                                    const ProbeScoreDeviceFacts& device);

// The launch plan of `path` for `shape` (`tuning`: {} outside benchmarks and tests).
// cudaErrorInvalidValue when the path cannot run the shape or the shape exceeds the workspace's
// limits. Host arithmetic only.
cudaError_t PlanProbeScore(const ProbeScoreShape& shape, ProbeScorePath path,
                           const ProbeScoreResources& resources, const ProbeScoreTuning& tuning,
                           ProbeScorePlan* plan);

// The plan in one line, as the benchmark records it: "pt=1 splits=16 grid=1x16x1 smem=1024"
// (fused_cuda), "tile=64x16 splits=16 grid=1x1x16" (fused_tc), "chunk_rows=8192 chunks=1"
// (gather_gemm), "tile=128x256 splits=1 grid=4x64x1 stages=4" (gather_wgmma); "no rows" for an
// empty plan.
std::string DescribeProbeScorePlan(const ProbeScorePlan& plan);

}  // namespace probesidecar::kernels
