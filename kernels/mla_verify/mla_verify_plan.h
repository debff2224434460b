// The split-KV plan's arithmetic, shared by the device plan kernel, the attention kernels and
// the CPU tests (plain C++, host and device).
//
// Work is counted in "units": one unit is one cache page (64 keys) of one request; a request of
// length L has max(1, ceil(L / 64)) units (an empty request still gets one, so that its output
// is written). The units of the batch are laid end to end (request 0's pages, then request 1's,
// ...) and cut into num_parts equal ranges of units_per_part; thread block p (of each row tile)
// processes range p. A request whose units fall into one range is computed whole by one block
// and written straight to the output; a request that spans several ranges is "split": each
// block writes a partial (normalised output + LSE) into its slot, and the combine kernel merges
// them. Only the first and the last request of a range can be split, so all split requests
// together use at most 2 * num_parts slots.
#pragma once

#include <cstdint>

#include "kernels/blocks/device_family.h"

// constexpr: the kernels size their shared memory from the same functions as the planner.
#if defined(__CUDACC__)
#define MLA_HD __host__ __device__ __forceinline__ constexpr
#else
#define MLA_HD constexpr
#endif

namespace probesidecar::kernels::mla {

// Plan array layout (int32, device, 3 * max_batch + 9 entries):
//   [0] units_per_part  [1] total units  [2] num_parts  [3] batch  [4] split requests
//   [kPlanCum .. kPlanCum + batch]            cum_units, batch + 1 entries (exclusive prefix)
//   [kPlanCum + batch + 1 .. + 2 * batch]     slot_base per request (-1 when not split)
//   [kPlanCum + 2 * batch + 1 .. + 3 * batch] the split requests' indices, in order (the
//                                             combine kernel's work list)
inline constexpr int kPlanHeader = 8;
inline constexpr int kPlanCum = kPlanHeader;

MLA_HD int64_t PlanInts(int64_t max_batch) { return 3 * max_batch + kPlanHeader + 1; }
// Batches of at most this many requests (one warp's lanes) on the sm_90a path are planned by the
// attention kernel's blocks themselves, each into its shared memory after its grid-dependency
// wait, instead of by the plan kernel before it: a block then waits only for what precedes the
// attention in the stream, not for a kernel of its own (the plan kernel's launch, run and
// completion were ~1.8 µs of a 21-51 µs Verify of one request: bench/mla_verify/NOTES.md).
inline constexpr int32_t kBlockPlanMaxBatch = 32;
MLA_HD bool PlanInBlock(int32_t batch) { return batch <= kBlockPlanMaxBatch; }
MLA_HD int32_t UnitsOf(int32_t len) { return len <= 0 ? 1 : (len + 63) / 64; }
MLA_HD int32_t UnitsPerPart(int32_t total, int32_t num_parts) {
  const int32_t per = (total + num_parts - 1) / num_parts;
  return per < 1 ? 1 : per;
}
// The first range holding a request whose units are [cum_begin, cum_end).
MLA_HD int32_t FirstPart(int32_t cum_begin, int32_t per) { return cum_begin / per; }
MLA_HD int32_t NumSplits(int32_t cum_begin, int32_t cum_end, int32_t per) {
  return (cum_end - 1) / per - cum_begin / per + 1;
}

// The portable tile kernel's shared-memory layout (mla_verify_kernel.cuh): a Q tile of `rows`
// rows, `stages` stages of kBlockN keys, the score exchange buffer.
inline constexpr int kBlockN = 32;       // keys per pipeline stage
inline constexpr int kSmemStride = 584;  // bf16 per shared row: 576 + 8 (rows 16 B apart in bank
                                         // space: ldmatrix is conflict free)
inline constexpr int kSStride = kBlockN + 8;  // floats per row of the score exchange buffer
MLA_HD int64_t TileSmemBytes(int32_t rows, int32_t stages) {
  return static_cast<int64_t>(rows) * kSmemStride * 2 +
         static_cast<int64_t>(stages) * kBlockN * kSmemStride * 2 +
         static_cast<int64_t>(rows) * kSStride * 4;
}

// The instantiations of the portable tile kernel (mla_verify.cu): (query rows, key stages), per
// row count the deepest ring first. The planner takes, for a device, the first that fits its
// blocks' shared memory (ChooseTile):
//   16x2 (94 KB): every family; two blocks per SM where the SM holds them (228 KB: sm_90/100).
//   32x4 (188 KB), 64x3 (193 KB): 227 KB blocks (sm_90, sm_100).
//   32x3 (151 KB), 64x2 (156 KB): 163 KB blocks (sm_80).
// On 99 KB blocks (sm_86/89/120) only 16x2 fits: rows beyond 16 go into 16-row tiles side by
// side, each reading a range's pages (from L2 after the first).
struct Tile {
  int32_t rows, stages;
};
inline constexpr int kNumTiles = 5;
inline constexpr Tile kTiles[kNumTiles] = {{16, 2}, {32, 4}, {32, 3}, {64, 3}, {64, 2}};
// Resident blocks per SM of the tile kernel for a tile size where the SM's shared memory allows
// (its __launch_bounds__: 2 for 16-row tiles, 1 otherwise).
MLA_HD int32_t BlocksPerSmFor(int32_t tile_rows) { return tile_rows == 16 ? 2 : 1; }
MLA_HD int32_t TileThreads(int32_t tile_rows) { return tile_rows * 8; }  // 4 warps per 16 rows

// What the planner knows of a device (MlaVerifyWorkspace: read once at its creation).
struct TileDevice {
  int64_t smem_per_block_optin = 0, smem_per_sm = 0, reserved_smem_per_block = 0;
  int32_t max_threads_per_sm = 0;
};
inline TileDevice TileDeviceFrom(const DeviceLimits& l) {
  return TileDevice{l.smem_per_block_optin, l.smem_per_sm, l.reserved_smem_per_block,
                    l.max_threads_per_sm};
}
struct TileChoice {
  int32_t index = -1;  // into kTiles; -1: no tile fits this device
  int32_t rows = 0, stages = 0;
  int32_t blocks_per_sm = 0;  // resident blocks per SM: shared memory, threads, launch bounds
};
inline int32_t ResidentBlocks(const Tile& t, const TileDevice& d) {
  const int64_t by_smem =
      d.smem_per_sm / (TileSmemBytes(t.rows, t.stages) + d.reserved_smem_per_block);
  const int64_t by_threads = d.max_threads_per_sm / TileThreads(t.rows);
  int64_t n = BlocksPerSmFor(t.rows);
  if (by_smem < n) n = by_smem;
  if (by_threads < n) n = by_threads;
  return static_cast<int32_t>(n);
}
inline bool TileFits(int index, const TileDevice& d) {
  if (index < 0 || index >= kNumTiles) return false;
  const Tile& t = kTiles[index];
  return TileSmemBytes(t.rows, t.stages) <= d.smem_per_block_optin && ResidentBlocks(t, d) >= 1;
}
// The tile for s_q * h_q = `rows` query rows: the smallest row count holding them all (16, 32,
// 64; 64 beyond), stepping down to smaller tiles while none of that row count fits.
inline TileChoice ChooseTile(int32_t rows, const TileDevice& d) {
  TileChoice c;
  for (int32_t want = rows <= 16 ? 16 : rows <= 32 ? 32 : 64; want >= 16; want /= 2) {
    for (int i = 0; i < kNumTiles; ++i) {
      if (kTiles[i].rows != want || !TileFits(i, d)) continue;
      c.index = i;
      c.rows = kTiles[i].rows;
      c.stages = kTiles[i].stages;
      c.blocks_per_sm = ResidentBlocks(kTiles[i], d);
      return c;
    }
  }
  return c;
}

// Row tiles: the s_q * h_q query rows of a request (ordered token-major: row = j * h_q + h) go
// into tiles of 16, 32 or 64 rows, whichever is the smallest that holds them all; more than 64
// rows (h_q = 128, or h_q = 64 with s_q > 1) are cut into 64-row tiles.
MLA_HD int32_t TileRowsFor(int32_t rows) { return rows <= 16 ? 16 : rows <= 32 ? 32 : 64; }
MLA_HD int32_t NumRowTiles(int32_t rows) {
  const int32_t m = TileRowsFor(rows);
  return (rows + m - 1) / m;
}
// Ranges (grid.y of the split kernel): one wave of blocks over all SMs, the row tiles of one
// range side by side so that they read its pages at the same time (once from HBM, then L2).
MLA_HD int32_t NumPartsFor(int32_t num_sms, int32_t rows, int32_t tile_rows,
                           int32_t blocks_per_sm) {
  const int32_t parts = num_sms * blocks_per_sm / ((rows + tile_rows - 1) / tile_rows);
  return parts < 1 ? 1 : parts;
}
// The portable path on a device with 227 KB blocks and 228 KB SMs (sm_90, sm_100): 16/32/64-row
// tiles; on others, ChooseTile's tile and NumPartsFor.
MLA_HD int32_t NumParts(int32_t num_sms, int32_t rows) {
  return NumPartsFor(num_sms, rows, TileRowsFor(rows), BlocksPerSmFor(TileRowsFor(rows)));
}
// The sm_90a path: always 64-row tiles (the wgmma M), one block per SM.
MLA_HD int32_t NumPartsSm90a(int32_t num_sms, int32_t rows) {
  return NumPartsFor(num_sms, rows, 64, 1);
}
// The sm_90a tile's schedule for s_q * h_q = `rows` query rows and `batch` requests: one page at a
// time for a single request held by one 64-row tile, page pairs otherwise. Measured on the H200
// (bench/mla_verify/NOTES.md): a pair costs less than two single pages once a block streams many
// pages (the pair's two score passes overlap each other's softmax), while the one-page kernel's
// shorter start and end win where each block has few pages; batch 1 with <= 64 rows was never
// slower with it (0.76-1.00 of the pair kernel's time), batch 8 and beyond lost at long
// sequences, and the lengths are not known when the plan is made.
MLA_HD bool UseOnePageSchedule(int32_t rows, int32_t batch) { return rows <= 64 && batch == 1; }
// The swap-AB schedule (mla_verify_sm90a_swap.cuh) puts the query rows on the wgmma N side: it
// exists for 16 and 32 rows (h_q is a multiple of 16, so s_q * h_q <= 32 is one of the two). The
// plan takes it where it measured faster than the schedules above (bench/mla_verify/NOTES.md,
// issue 28 swap-AB, run at adf2e72): 16 rows and one request (0.94-0.97 of the one-page kernel's
// time at 1k-64k). Elsewhere it was not faster everywhere: 16 rows x 8 requests 0.91-1.05 of the
// page-pair kernel's time (slower at 64k), x 64-128 requests 0.96-1.08; 32 rows 1.06-1.37.
inline constexpr int32_t kSwapAbMaxRows = 32;
MLA_HD bool SwapAbFits(int32_t rows) { return rows == 16 || rows == kSwapAbMaxRows; }
MLA_HD bool UseSwapAbSchedule(int32_t rows, int32_t batch) { return rows == 16 && batch == 1; }
// A bound on the split requests of a plan, the combine kernel's grid: each spans a boundary between
// two ranges and no two share one, so there are at most min(batch, num_parts - 1);
// min(batch, num_parts) keeps the grid non-empty for a single range.
MLA_HD int32_t MaxSplitRequests(int32_t batch, int32_t num_parts) {
  return batch < num_parts ? batch : num_parts;
}
// Partial-output rows a workspace needs for any shape: 2 * num_parts * rows is largest for
// 16-row tiles (2 * 2 * num_sms * 16) and 64-row tiles (2 * num_sms * 64).
MLA_HD int64_t PartialRowsFor(int32_t num_sms) { return 2 * static_cast<int64_t>(num_sms) * 64; }

}  // namespace probesidecar::kernels::mla
