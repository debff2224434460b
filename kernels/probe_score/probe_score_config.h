// Compile-time shapes of the probe-scoring kernels: the padded weight layout, the fused_cuda block
// shape and probe counts, and the fused_tc tile configurations. Plain C++: the host-side planner
// (probe_score_plan.cc) and the kernels (the .cuh files) read the same numbers.
#pragma once

namespace probesidecar::kernels::probe_score_detail {

// Weights are stored padded: rows to a multiple of kProbePad (zeros), columns to a multiple of
// kHiddenPad (zeros), so tensor-core tiles never need bounds checks on W.
inline constexpr int kProbePad = 128;
inline constexpr int kHiddenPad = 64;

// fused_cuda: 256 threads = 8 warps, 4 rows per warp, so a block streams 32 rows at a time.
inline constexpr int kFusedThreads = 256;
inline constexpr int kFusedRowsPerWarp = 4;
inline constexpr int kFusedRowsPerBlock = 32;
// Instantiations: probes per block pass kPT in {1, 2, 4, 8, 16}, index 0..4.
inline constexpr int kNumFusedPT = 5;
inline constexpr int kFusedPTValues[kNumFusedPT] = {1, 2, 4, 8, 16};
// Largest W slice a fused_cuda block keeps in shared memory, bytes (the kernels' dynamic shared
// memory limit, raised once when the workspace is created).
inline constexpr int kFusedSmemLimit = 64 << 10;

// fused_tc tile configuration: a block of wm x wn warps computes a bm x bn tile of the output,
// stepping over K in bk-wide tiles through `stages` shared-memory stages.
struct TcTileConfig {
  int bm, bn, bk;  // tile rows (gathered x rows), columns (probes), K depth, elements
  int wm, wn;      // warps along M and N
  int stages;
  const char* name;
};
// When each runs: ChooseTcConfig in probe_score_plan.cc.
//   0 "64x16":      P <= 16 with few rows: 4 warps stacked along M, BK 64, 4 stages (40 KB).
//   1 "64x64":      mid P, or few rows with many probes (split-K over H), 4 stages (64 KB).
//   2 "128x128":    many rows and probes, 8 warps of 64 x 32, 3 stages (96 KB).
//   3 "32x16k256":  P <= 16 with many rows, memory-bound: BK 256 so each gathered row is read
//                   in 512-byte pieces, 2 warps, 3 stages (72 KB).
//   4 "64x16k128":  the same idea with BK 128, 4 warps, 4 stages (80 KB).
//   5 "64x64s2":    64x64 in 2 stages (fast 32 KB, exact 64 KB): where 1 does not fit a block
//                   (exact precision on a 99 KB sm_86/89/120 block).
//   6 "128x128s2":  128x128 in 2 stages (fast 64 KB, exact 128 KB): where 2 does not fit
//                   (exact precision on a 163 KB sm_80 block).
// Shared memory is the sizes for fast precision; exact adds two B tiles per stage (TcSmemBytes).
inline constexpr int kNumTcConfigs = 7;
inline constexpr TcTileConfig kTcConfigs[kNumTcConfigs] = {
    {64, 16, 64, 4, 1, 4, "64x16"},       {64, 64, 64, 2, 2, 4, "64x64"},
    {128, 128, 64, 2, 4, 3, "128x128"},   {32, 16, 256, 2, 1, 3, "32x16k256"},
    {64, 16, 128, 4, 1, 4, "64x16k128"},  {64, 64, 64, 2, 2, 2, "64x64s2"},
    {128, 128, 64, 2, 4, 2, "128x128s2"},
};
// The configuration the planner takes instead of each when it does not fit a block of the device
// (-1: none; 64x16 fits 56 KB at exact precision, less than any supported GPU has).
inline constexpr int kTcFallback[kNumTcConfigs] = {-1, 5, 6, 4, 0, 0, 5};
constexpr int TcThreads(const TcTileConfig& c) { return c.wm * c.wn * 32; }
// Both operands are 16-bit: stages x (A tile + `terms` B tiles) x 2 bytes (exact precision
// multiplies each A tile by three weight terms).
constexpr int TcSmemBytes(const TcTileConfig& c, int terms) {
  return c.stages * (c.bm * c.bk + terms * c.bn * c.bk) * 2;
}

// gather_wgmma tile configuration (sm_90a): `wgs` warpgroups of 64 rows each x `bn` probes,
// K in 64-deep tiles through as many shared-memory stages as fit (WgmmaStages).
//   0 "128x256":  many rows and probes, fast precision only (three 256-row terms do not fit).
//   1 "128x128":  many rows, fewer probes, or exact precision.
//   2 "64x128":   few rows (split-K over H keeps the SMs busy).
//   3 "128x256ws": 128x256 warp-specialised (a producer warpgroup, TMA for W, an mbarrier ring),
//                  fast precision without split (probe_score_wgmma_ws_sm90a.cuh).
struct WgmmaTileConfig {
  int wgs, bn;
  const char* name;
  bool ws = false;  // warp-specialised: one more (producer) warpgroup, fast only, no split
};
inline constexpr int kNumWgmmaConfigs = 4;
inline constexpr WgmmaTileConfig kWgmmaConfigs[kNumWgmmaConfigs] = {
    {2, 256, "128x256"}, {2, 128, "128x128"}, {1, 128, "64x128"}, {2, 256, "128x256ws", true}};
inline constexpr int kWgmmaMaxStages = 6;
inline constexpr int kWgmmaSmemBudget = 200 << 10;  // of the 227 KB a block may have
constexpr int WgmmaStageBytes(const WgmmaTileConfig& c, int terms) {
  return (64 * c.wgs + terms * c.bn) * 128;  // 128 bytes per 64-element tile row
}
// Stages of the ring; below 2 (3 for the plain kernel, which loads kStages - 2 ahead) the
// configuration cannot run these terms. The warp-specialised one runs 4 stages, fast only.
constexpr int WgmmaStages(const WgmmaTileConfig& c, int terms) {
  if (c.ws) return terms == 1 ? 4 : 0;
  const int fit = kWgmmaSmemBudget / WgmmaStageBytes(c, terms);
  return fit < kWgmmaMaxStages ? fit : kWgmmaMaxStages;
}
constexpr int WgmmaThreads(const WgmmaTileConfig& c) { return 128 * (c.wgs + (c.ws ? 1 : 0)); }
// The warp-specialised kernel brings W's tiles in by TMA, boxes of 64 K columns x 256 probe rows
// (its k-tile and its N): the box of the tensor map CreateProbeWeights encodes.
inline constexpr int kWsWeightBoxCols = 64;
inline constexpr int kWsWeightBoxRows = 256;
// + 1024: the swizzle's alignment; + 128: the warp-specialised ring's mbarriers.
constexpr int WgmmaSmemBytes(const WgmmaTileConfig& c, int terms) {
  return 1024 + WgmmaStages(c, terms) * WgmmaStageBytes(c, terms) + (c.ws ? 128 : 0);
}

}  // namespace probesidecar::kernels::probe_score_detail
