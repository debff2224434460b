// Launch plans: host arithmetic on the shape (max_rows, P, H, dtype), the device facts and the
// workspace limits. Plain C++, no device code: the CPU tests plan for any device. The tile and
// split rules come from variants the benchmark times (`probe-score-bench --variants`, listed
// under "Variants" in its report; history in bench/NOTES.md, "Run 2").
#include "kernels/probe_score/probe_score_plan.h"

#include <algorithm>
#include <cstdio>

namespace probesidecar::kernels {

using probe_score_detail::kFusedPTValues;
using probe_score_detail::kFusedRowsPerBlock;
using probe_score_detail::kFusedSmemLimit;
using probe_score_detail::kFusedThreads;
using probe_score_detail::kNumTcConfigs;
using probe_score_detail::kNumWgmmaConfigs;
using probe_score_detail::kProbePad;
using probe_score_detail::kTcConfigs;
using probe_score_detail::kWgmmaConfigs;
using probe_score_detail::TcSmemBytes;
using probe_score_detail::TcTileConfig;
using probe_score_detail::WgmmaSmemBytes;
using probe_score_detail::WgmmaStages;

namespace {

constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;  // cuBLAS's advice for Hopper
constexpr int64_t kPartialBytes = int64_t{32} << 20;          // split-K partial sums
constexpr int32_t kNumCounters = 65536;                       // split-K tile counters
constexpr int64_t kStagingCapBytes = int64_t{128} << 20;      // each gather_gemm staging buffer

// Weight terms the 16-bit paths multiply by: exact precision splits each float32 weight into
// three (float32 activations read the float32 weights whatever the precision).
int32_t WeightTerms16(const ProbeScoreShape& shape) {
  return shape.precision == ProbePrecision::kExact && shape.dtype != common::DType::kFloat32 ? 3
                                                                                             : 1;
}

ProbeScoreGrid Grid(int64_t x, int64_t y, int64_t z) {
  return ProbeScoreGrid{static_cast<uint32_t>(x), static_cast<uint32_t>(y),
                        static_cast<uint32_t>(z)};
}

int FusedPtIndex(int32_t num_probes) {
  if (num_probes <= 1) return 0;
  if (num_probes <= 2) return 1;
  if (num_probes <= 4) return 2;
  if (num_probes <= 8) return 3;
  return 4;
}

// Resident fused_cuda blocks per SM: the tightest of registers, threads and shared memory.
int FusedOccupancy(const ProbeScoreDeviceFacts& device, common::DType dtype, int pt_index,
                   int smem_bytes) {
  const int regs = std::max(device.fused_cuda_regs[static_cast<int>(dtype)][pt_index], 1);
  const int regs_per_warp = static_cast<int>(RoundUp(regs * 32, 256));
  const int warps = kFusedThreads / 32;
  const int by_regs = device.regs_per_sm / (regs_per_warp * warps);
  const int by_threads = device.max_threads_per_sm / kFusedThreads;
  const int by_smem =
      static_cast<int>(device.smem_per_sm / (smem_bytes + device.reserved_smem_per_block + 1024));
  return std::max(1, std::min({by_regs, by_threads, by_smem}));
}

cudaError_t PlanFusedCuda(const ProbeScoreShape& shape, const ProbeScoreResources& res,
                          const ProbeScoreTuning& tuning, ProbeScorePlan* plan) {
  const int32_t P = shape.num_probes, H = shape.hidden;
  const int pt_index = FusedPtIndex(P);
  const int pt = kFusedPTValues[pt_index];
  const int vec = shape.dtype == common::DType::kFloat32 ? 4 : 8;  // elements per 16 bytes
  const int gran = 32 * vec;
  const int64_t k_chunks = CeilDiv(H, gran);
  const int64_t smem_chunks = std::max<int64_t>(1, (kFusedSmemLimit / (pt * 4)) / gran);
  const int64_t row_blocks = CeilDiv(shape.max_rows, kFusedRowsPerBlock);
  const int64_t probe_tiles = CeilDiv(P, pt);

  // W slice held in shared memory: the whole K range of a split when it fits.
  const int64_t smem_bytes_full = std::min(k_chunks, smem_chunks) * gran * pt * 4;
  const int occ =
      FusedOccupancy(res.device, shape.dtype, pt_index, static_cast<int>(smem_bytes_full));
  const int64_t target_blocks = static_cast<int64_t>(res.device.num_sms) * occ;

  // K splits only when rows x probe tiles fill less than half the machine (few rows): the
  // fix-up costs a few dependent memory round trips at the tail (bench/NOTES.md, run 1).
  int64_t splits = 1;
  if (2 * row_blocks * probe_tiles <= target_blocks) {
    splits = std::min(k_chunks, CeilDiv(target_blocks, row_blocks * probe_tiles));
  }
  if (tuning.splits > 0) splits = std::min<int64_t>(tuning.splits, k_chunks);
  const int64_t partial_per_split = static_cast<int64_t>(shape.max_rows) * probe_tiles * pt;
  if (splits > 1 && splits * partial_per_split > res.workspace.partial_floats) {
    splits = std::max<int64_t>(1, res.workspace.partial_floats / partial_per_split);
  }
  const int64_t chunks_per_split = CeilDiv(k_chunks, splits);
  splits = CeilDiv(k_chunks, chunks_per_split);  // every split non-empty
  const int64_t k_per_split = chunks_per_split * gran;
  const int64_t k_per_smem = std::min(chunks_per_split, smem_chunks) * gran;

  int64_t row_groups = std::min(row_blocks, CeilDiv(target_blocks, splits * probe_tiles));
  row_groups = std::max<int64_t>(row_groups, 1);
  const int64_t iters = CeilDiv(row_blocks, row_groups);
  row_groups = CeilDiv(row_blocks, iters);  // balanced: every group does `iters` row blocks
  if (splits > 1 && row_groups * probe_tiles > res.workspace.counters) {
    return cudaErrorInvalidValue;
  }
  if (probe_tiles > 65535 || splits > 65535) return cudaErrorInvalidValue;

  FusedCudaPlan& p = plan->fused_cuda;
  p.pt_index = pt_index;
  p.k_per_split = static_cast<int32_t>(k_per_split);
  p.k_per_smem = static_cast<int32_t>(k_per_smem);
  p.smem_bytes = static_cast<int32_t>(pt * k_per_smem * 4);
  p.grid = Grid(row_groups, splits, probe_tiles);
  if (splits > 1) {
    plan->needs.partial_floats = splits * partial_per_split;
    plan->needs.counters = static_cast<int32_t>(row_groups * probe_tiles);
  }
  return cudaSuccess;
}

// Tile configuration for fused_tc (kTcConfigs), from the variants timed in run 2:
//  - P <= 16: 64x16 below 768 rows; 64x16k128 up to 6K rows; 32x16k256 beyond (the longer the
//    K tile, the larger the contiguous piece of each gathered row).
//  - R <= 64, P <= 256: 64x16 with 8 splits.
//  - otherwise 64x64, or 128x128 once its tiles cover the SMs.
int ChooseTcConfig(int32_t max_rows, int32_t num_probes, int num_sms) {
  if (num_probes <= 16) return max_rows >= 6144 ? 3 : (max_rows >= 768 ? 4 : 0);
  if (max_rows <= 64 && num_probes <= 256) return 0;
  if (num_probes <= 64) return 1;
  const int64_t big_tiles = CeilDiv(max_rows, 128) * CeilDiv(num_probes, 128);
  return big_tiles >= num_sms ? 2 : 1;
}

cudaError_t PlanFusedTc(const ProbeScoreShape& shape, const ProbeScoreResources& res,
                        const ProbeScoreTuning& tuning, ProbeScorePlan* plan) {
  const int32_t P = shape.num_probes, H = shape.hidden;
  const int num_sms = res.device.num_sms;
  const int terms = WeightTerms16(shape);
  const bool forced = tuning.tc_config >= 0 && tuning.tc_config < kNumTcConfigs;
  int config = forced ? tuning.tc_config : ChooseTcConfig(shape.max_rows, P, num_sms);
  // On a device with less shared memory per block (sm_80: 163 KB, sm_86/89/120: 99 KB) the
  // chosen tile steps down its fallback chain (fewer stages, then a smaller tile) until it fits;
  // a forced configuration that does not fit is refused.
  while (config >= 0 && !TcConfigFits(config, terms, res.device)) {
    config = forced ? -1 : probe_score_detail::kTcFallback[config];
  }
  if (config < 0) return cudaErrorInvalidValue;
  const TcTileConfig& info = kTcConfigs[config];
  const int64_t m_tiles = CeilDiv(shape.max_rows, info.bm);
  const int64_t n_tiles = CeilDiv(P, info.bn);
  const int64_t tiles = m_tiles * n_tiles;
  const int64_t k_tiles = CeilDiv(H, info.bk);
  // Split K only when the tiles cannot cover the SMs (few rows), each split at least 4 K tiles
  // long; the partials go through a second (reduction) kernel. About one CTA per SM in general;
  // for a single row tile with few probe tiles (R <= 64 with P up to a few hundred) about two,
  // at most 16 splits (the most timed; R=64 P=1024 64x64 gained up to 16), and 64x16 beyond 16
  // probes at most 8, as timed.
  int64_t splits = 1;
  const int64_t max_splits = std::max<int64_t>(1, k_tiles / 4);
  if (m_tiles == 1 && tiles * 4 <= num_sms) {
    splits = std::min(max_splits, CeilDiv(2 * num_sms, tiles));
    if (config != 0) splits = std::min<int64_t>(splits, 16);
    if (config == 0 && P > 16) splits = std::min<int64_t>(splits, 8);
  } else if (tiles < num_sms) {
    splits = std::min(max_splits, CeilDiv(num_sms, tiles));
  }
  if (tuning.splits > 0) splits = std::min<int64_t>(tuning.splits, k_tiles);
  const int64_t partial_rows = m_tiles * info.bm, partial_ld = n_tiles * info.bn;
  if (splits > 1 && splits * partial_rows * partial_ld > res.workspace.partial_floats) {
    splits = std::max<int64_t>(1, res.workspace.partial_floats / (partial_rows * partial_ld));
  }
  if (n_tiles > 2147483647 || m_tiles > 65535 || splits > 65535) return cudaErrorInvalidValue;

  FusedTcPlan& p = plan->fused_tc;
  p.config = config;
  p.k_tiles = static_cast<int32_t>(k_tiles);
  p.partial_rows = static_cast<int32_t>(partial_rows);
  p.partial_ld = static_cast<int32_t>(partial_ld);
  p.terms = terms;
  p.smem_bytes = TcSmemBytes(info, p.terms);
  p.grid = Grid(n_tiles, m_tiles, splits);
  if (splits > 1) {
    p.reduce_grid = Grid(CeilDiv(static_cast<int64_t>(shape.max_rows) * P, 256), 1, 1);
    plan->needs.partial_floats = splits * partial_rows * partial_ld;
  }
  return cudaSuccess;
}

// gather_gemm: gather -> cuBLAS -> epilogue, in as few row chunks as the staging buffers
// allow. (Chunks sized to stay in L2 were measured slower: cuBLAS loses more at small M than
// the staging round trip costs, bench/NOTES.md run 1.)
cudaError_t PlanGatherGemm(const ProbeScoreShape& shape, const ProbeScoreResources& res,
                           const ProbeScoreTuning& tuning, ProbeScorePlan* plan) {
  const int64_t elem = common::DTypeSize(shape.dtype);
  const int64_t ldc = RoundUp(shape.num_probes, 4);
  const int64_t x_row = shape.hidden * elem, c_row = ldc * 4;
  const int64_t cap_rows =
      std::min(res.workspace.staging_x_bytes / x_row, res.workspace.staging_c_bytes / c_row);
  if (cap_rows < 1) return cudaErrorInvalidValue;
  int64_t chunk = shape.max_rows;
  if (tuning.gather_chunk_rows > 0) chunk = std::min<int64_t>(chunk, tuning.gather_chunk_rows);
  if (chunk > cap_rows) {
    // Equal chunks rather than a full one and a small tail.
    const int64_t n = CeilDiv(chunk, cap_rows);
    chunk = RoundUp(CeilDiv(chunk, n), 64);
    if (chunk > cap_rows) chunk = cap_rows;
  }
  chunk = std::max<int64_t>(1, chunk);
  GatherGemmPlan& p = plan->gather_gemm;
  p.chunk_rows = static_cast<int32_t>(chunk);
  p.num_chunks = static_cast<int32_t>(CeilDiv(shape.max_rows, chunk));
  p.ldc = static_cast<int32_t>(ldc);
  p.terms = WeightTerms16(shape);
  plan->needs.staging_x_bytes = chunk * x_row;
  plan->needs.staging_c_bytes = chunk * c_row;
  return cudaSuccess;
}

// gather_wgmma: the largest tile whose tiles still cover the SMs (128x256, warp-specialised,
// needs fast precision: three 256-probe terms do not fit), 64x128 with split-K over H for few rows;
// the splits bring the CTAs to about one per SM, each split at least 4 K tiles long.
int ChooseWgmmaConfig(int32_t max_rows, int32_t num_probes, int terms, int num_sms) {
  const auto tiles = [&](int c) {
    return CeilDiv(max_rows, 64 * kWgmmaConfigs[c].wgs) * CeilDiv(num_probes, kWgmmaConfigs[c].bn);
  };
  // 128x256 warp-specialised from three quarters of a wave: a 128-CTA grid (R = 4096, P = 1024)
  // still beats twice the CTAs of 128x128.
  if (terms == 1 && 4 * tiles(0) >= 3 * num_sms) return 3;
  if (tiles(1) >= num_sms) return 1;
  return 2;
}

cudaError_t PlanGatherWgmma(const ProbeScoreShape& shape, const ProbeScoreResources& res,
                            const ProbeScoreTuning& tuning, ProbeScorePlan* plan) {
  const int32_t P = shape.num_probes, H = shape.hidden;
  const int num_sms = res.device.num_sms;
  const int terms = WeightTerms16(shape);
  // A forced configuration that cannot hold these terms falls back to the planner's choice.
  const bool forced = tuning.wgmma_config >= 0 && tuning.wgmma_config < kNumWgmmaConfigs &&
                      WgmmaStages(kWgmmaConfigs[tuning.wgmma_config], terms) >= 3;
  const int config =
      forced ? tuning.wgmma_config : ChooseWgmmaConfig(shape.max_rows, P, terms, num_sms);
  const int bm = 64 * kWgmmaConfigs[config].wgs, bn = kWgmmaConfigs[config].bn;
  const int64_t m_tiles = CeilDiv(shape.max_rows, bm), n_tiles = CeilDiv(P, bn);
  const int64_t tiles = m_tiles * n_tiles;
  const int64_t k_tiles = CeilDiv(H, 64);
  int64_t splits = 1;
  if (tiles < num_sms) {
    splits = std::min(std::max<int64_t>(1, k_tiles / 4), CeilDiv(num_sms, tiles));
  }
  if (tuning.splits > 0) splits = std::min<int64_t>(tuning.splits, k_tiles);
  if (kWgmmaConfigs[config].ws) splits = 1;  // the warp-specialised kernel writes whole sums
  const int64_t partial_rows = m_tiles * bm, partial_ld = n_tiles * bn;
  if (splits > 1 && splits * partial_rows * partial_ld > res.workspace.partial_floats) {
    splits = std::max<int64_t>(1, res.workspace.partial_floats / (partial_rows * partial_ld));
  }
  if (n_tiles > 2147483647 || m_tiles > 65535 || splits > 65535) return cudaErrorInvalidValue;
  FusedTcPlan& p = plan->gather_wgmma;
  p.config = config;
  p.terms = terms;
  p.k_tiles = static_cast<int32_t>(k_tiles);
  p.partial_rows = static_cast<int32_t>(partial_rows);
  p.partial_ld = static_cast<int32_t>(partial_ld);
  p.smem_bytes = WgmmaSmemBytes(kWgmmaConfigs[config], terms);
  p.grid = Grid(n_tiles, m_tiles, splits);
  if (splits > 1) {
    p.reduce_grid = Grid(CeilDiv(static_cast<int64_t>(shape.max_rows) * P, 256), 1, 1);
    plan->needs.partial_floats = splits * partial_rows * partial_ld;
  }
  return cudaSuccess;
}

}  // namespace

ProbeScoreDeviceFacts ProbeScoreFactsFrom(const DeviceLimits& limits) {
  ProbeScoreDeviceFacts d;
  d.cc_major = limits.cc_major;
  d.cc_minor = limits.cc_minor;
  d.num_sms = limits.num_sms;
  d.smem_per_sm = limits.smem_per_sm;
  d.smem_per_block_optin = limits.smem_per_block_optin;
  d.reserved_smem_per_block = limits.reserved_smem_per_block;
  d.max_threads_per_sm = limits.max_threads_per_sm;
  d.regs_per_sm = limits.regs_per_sm;
  return d;
}

bool TcConfigFits(int config, int terms, const ProbeScoreDeviceFacts& device) {
  if (config < 0 || config >= kNumTcConfigs) return false;
  return TcSmemBytes(kTcConfigs[config], terms) <= device.smem_per_block_optin;
}

ProbeScoreWorkspaceLimits ProbeScoreWorkspaceLimitsFor(const ProbeScoreWorkspaceConfig& config) {
  ProbeScoreWorkspaceLimits l;
  l.max_rows = config.max_rows;
  l.max_hidden = config.max_hidden;
  l.max_probes = config.max_probes;
  // Staging for every row of the largest shape, capped at kStagingCapBytes per buffer unless
  // 256 rows need more (then gather_gemm works in chunks).
  const int64_t p_pad = RoundUp(config.max_probes, kProbePad);
  const int64_t min_rows = std::min<int32_t>(config.max_rows, 256);
  const int64_t max_rows = config.max_rows, max_hidden = config.max_hidden;
  l.staging_x_bytes = RoundUp(
      std::min(max_rows * max_hidden * 4, std::max(kStagingCapBytes, min_rows * max_hidden * 4)),
      256);
  l.staging_c_bytes = RoundUp(
      std::min(max_rows * p_pad * 4, std::max(kStagingCapBytes, min_rows * p_pad * 4)), 256);
  l.partial_floats = kPartialBytes / 4;
  l.counters = kNumCounters;
  l.cublas_workspace_bytes = kCublasWorkspaceBytes;
  return l;
}

cudaError_t PlanProbeScore(const ProbeScoreShape& shape, ProbeScorePath path,
                           const ProbeScoreResources& resources, const ProbeScoreTuning& tuning,
                           ProbeScorePlan* plan) {
  if (plan == nullptr) return cudaErrorInvalidValue;
  *plan = ProbeScorePlan{};
  const ProbeScoreWorkspaceLimits& limits = resources.workspace;
  const int dtype = static_cast<int>(shape.dtype);
  if (dtype < 0 || dtype >= common::kNumDTypes || shape.max_rows < 0 ||
      shape.max_rows > limits.max_rows || shape.hidden > limits.max_hidden ||
      shape.num_probes > limits.max_probes || resources.device.num_sms < 1 ||
      !ProbeScorePathSupports(path, shape, resources.device)) {
    return cudaErrorInvalidValue;
  }
  plan->shape = shape;
  plan->path = path;
  if (shape.max_rows == 0) return cudaSuccess;
  switch (path) {
    case ProbeScorePath::kFusedCuda:
      return PlanFusedCuda(shape, resources, tuning, plan);
    case ProbeScorePath::kFusedTensorCore:
      return PlanFusedTc(shape, resources, tuning, plan);
    case ProbeScorePath::kGatherGemm:
      return PlanGatherGemm(shape, resources, tuning, plan);
    case ProbeScorePath::kGatherWgmma:
      return PlanGatherWgmma(shape, resources, tuning, plan);
  }
  return cudaErrorInvalidValue;
}

std::string DescribeProbeScorePlan(const ProbeScorePlan& plan) {
  if (plan.shape.max_rows == 0) return "no rows";
  char buf[160] = "";
  switch (plan.path) {
    case ProbeScorePath::kFusedCuda: {
      const FusedCudaPlan& f = plan.fused_cuda;
      std::snprintf(buf, sizeof(buf), "pt=%d splits=%u grid=%ux%ux%u smem=%d",
                    kFusedPTValues[f.pt_index], f.grid.y, f.grid.x, f.grid.y, f.grid.z,
                    f.smem_bytes);
      break;
    }
    case ProbeScorePath::kFusedTensorCore: {
      const FusedTcPlan& t = plan.fused_tc;
      std::snprintf(buf, sizeof(buf), "tile=%s splits=%u grid=%ux%ux%u", kTcConfigs[t.config].name,
                    t.grid.z, t.grid.x, t.grid.y, t.grid.z);
      break;
    }
    case ProbeScorePath::kGatherGemm:
      std::snprintf(buf, sizeof(buf), "chunk_rows=%d chunks=%d", plan.gather_gemm.chunk_rows,
                    plan.gather_gemm.num_chunks);
      break;
    case ProbeScorePath::kGatherWgmma: {
      const FusedTcPlan& t = plan.gather_wgmma;
      std::snprintf(buf, sizeof(buf), "tile=%s splits=%u grid=%ux%ux%u stages=%d",
                    kWgmmaConfigs[t.config].name, t.grid.z, t.grid.x, t.grid.y, t.grid.z,
                    WgmmaStages(kWgmmaConfigs[t.config], t.terms));
      break;
    }
  }
  return buf;
}

}  // namespace probesidecar::kernels
