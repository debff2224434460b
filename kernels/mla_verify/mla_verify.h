// MLA speculative-decoding verify attention on a paged latent KV cache (FlashMLA's layout).
//
// Per request i of a batch, with L = cache_seqlens[i] (the s_q new tokens included):
//   S[j, h, k] = softmax_scale * dot(q[i, j, h, 0:576], K[k, 0:576])  for k <= L - s_q + j
//   out[i, j, h, :] = sum_k softmax_k(S[j, h, :]) * K[k, 0:512]       (V = first 512 of each key)
//   lse[i, h, j]    = ln sum_k exp(S[j, h, k])                         (natural log, scaled)
// where K[k] is row k % 64 of page block_table[i, k / 64] of the cache. Causal is bottom-right
// aligned. A query row that sees no key (only when L < s_q) gets out = 0 and lse = -inf.
//
// Paths (MlaVerifyPath): the split-KV paths spread every request's keys over all SMs with a plan
// made on the device, then merge the partial results by their LSEs: kSplitKv (portable:
// mma.sync, 16/32/64-row tiles) and kSplitKvSm90a (wgmma + TMA, 64-row tiles, two warpgroups per
// tile with a schedule the plan picks by row count, MlaVerifySm90aSchedule; sm_90a machine code;
// ChooseMlaVerifyPath says where it is used); the
// baseline runs one block per (request, row tile) over the whole sequence. Every launch is
// graph-capturable: no allocation, no host synchronisation, no device-property query; lengths
// and page tables are read on the device, so one captured graph serves any lengths of its
// (batch, s_q, h_q).
//
// Use in a decode step with many layers (one stream):
//   MlaVerifyPlan plan;
//   PlanMlaVerify(params_of_any_layer, path, ws, stream, &plan);  // after cache_seqlens is written
//   for each layer: RunMlaVerify(plan, params_of_layer, stream);  // same shape and lengths
// or LaunchMlaVerify() / LaunchMlaVerifyPath() for both. All of it can sit inside one captured
// graph. The plan's device part lives in the workspace, so one workspace serves one stream at a
// time, and a plan is valid until the next PlanMlaVerify on its workspace.
//
// Query rows of a request are ordered token-major (row = j * h_q + h) and tiled 16/32/64 at a
// time; beyond 64 rows (h_q = 128, or h_q = 64 with s_q > 1) the 64-row tiles of one key range
// run side by side, so a page comes from HBM once and from L2 for the other tiles.
//
// Requirements the kernels rely on (the caller validates; nothing is checked on the device):
//   q, kv_cache, out 16-byte aligned; every stride below a multiple of 8 elements (16 bytes);
//   block_table[i, 0 : ceil(L/64)] valid page indices; 1 <= batch <= workspace max_batch;
//   s_q in 1..16; h_q in {16, 32, 64, 128}; L <= max_pages * 64 and L < 2^31 / 64 pages in total.
// The launchers return cudaErrorInvalidValue for what they can check on the host (sizes,
// alignment, a missing workspace, a plan that does not match).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/blocks/device_family.h"
#include "kernels/mla_verify/mla_verify_limits.h"

namespace probesidecar::kernels {

enum class MlaVerifyPath : int32_t {
  kSplitKv = 0,       // portable split-KV (mma.sync + cp.async), every family (kTiles per device)
  kBaseline = 1,      // one block per (request, row tile), no split: the in-tree A/B baseline
  kSplitKvSm90a = 2,  // split-KV with wgmma + TMA (sm_90a machine code), same plan and combine
};
inline constexpr int kNumMlaVerifyPaths = 3;

// "split_kv", "baseline", "split_kv_sm90a" (the names used in metrics and benchmarks).
const char* MlaVerifyPathName(MlaVerifyPath path);

// How the split_kv_sm90a tile walks its range of cache pages (mla_verify_sm90a*.cuh): the plan
// picks by row count and batch (mla::UseOnePageSchedule) unless a workspace made for tests or
// benchmarks forces one.
enum class MlaVerifySm90aSchedule : int32_t {
  kAuto = 0,       // the plan's choice
  kPagePairs = 1,  // two pages at a time, one per warpgroup ("seesaw")
  kOnePage = 2,    // one page at a time, both warpgroups on it, the other buffer refilling
  kSwapAb = 3,     // s_q * h_q <= 32 only: keys on the wgmma M side, a ring of TMA boxes
};
// "auto", "page_pairs", "one_page", "swap_ab".
const char* MlaVerifySm90aScheduleName(MlaVerifySm90aSchedule schedule);

struct MlaVerifyParams {
  int32_t batch = 0;  // b
  int32_t s_q = 0;    // query tokens per request, 1..16
  int32_t h_q = 0;    // query heads, 16/32/64/128
  float softmax_scale = 0.0f;

  const __nv_bfloat16* q = nullptr;  // [b, s_q, h_q, 576]: latent 512, then rope 64
  int64_t q_batch_stride = 0;        // elements between requests
  int64_t q_token_stride = 0;        // elements between query tokens of one request
  int64_t q_head_stride = 0;         // elements between heads (576 when dense)

  const __nv_bfloat16* kv_cache = nullptr;  // [num_pages, 64, 576]
  int64_t kv_page_stride = 0;               // elements between pages (64 * 576 when dense)
  int64_t kv_row_stride = 0;                // elements between tokens of a page (576 when dense)
  int32_t num_pages = 0;                    // pages in kv_cache; 0 = not given (TMA bound)

  const int32_t* block_table = nullptr;  // [b, max_pages] page indices
  int64_t block_table_batch_stride = 0;  // elements between requests' rows
  int32_t max_pages = 0;                 // pages per row of block_table

  const int32_t* cache_seqlens = nullptr;  // [b] L per request, the s_q new tokens included

  __nv_bfloat16* out = nullptr;  // [b, s_q, h_q, 512]
  int64_t out_batch_stride = 0;
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;  // 512 when dense

  float* lse = nullptr;  // optional [b, h_q, s_q] float32 (natural log, scale included)
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;  // the token stride is 1
};

// Per-stream scratch: the device plan (per-request split bookkeeping) and the partial outputs of
// split requests. Allocations happen only in CreateMlaVerifyWorkspace.
//
// Sizing: the plan, mla::PlanInts(max_batch) = 3 * max_batch + 9 int32 (mla_verify_plan.h);
// partial outputs 2 * num_sms * 64 rows * 512 float32 (34.6 MB on a 132-SM H200) and their LSEs:
// independent of lengths, because a block's key range is one contiguous range of the flattened
// batch, so at most 2 * (blocks) partial row-tiles exist at once.
struct MlaVerifyWorkspaceConfig {
  int32_t max_batch = kMlaMaxBatch;
  int32_t device = -1;  // -1: the current device
  // Tests and benchmarks only: choose tiles as for a device of this family (ClampToFamily: its
  // shared-memory and thread limits, no sm_90a path off sm_90) on the GPU in hand. nullptr: the
  // device's own limits.
  const DeviceFamily* limit_to_family = nullptr;
  // Tests and benchmarks only: the split_kv_sm90a schedule every plan on this workspace takes
  // (kSwapAb only where s_q * h_q <= 32; other shapes get the plan's own choice).
  MlaVerifySm90aSchedule sm90a_schedule = MlaVerifySm90aSchedule::kAuto;
};

struct MlaVerifyWorkspace {
  int32_t device = 0;
  int32_t num_sms = 0;  // read once at creation
  int32_t max_batch = 0;
  bool has_sm90a = false;  // compute capability 9.0, this build holds the sm_90a kernels, and the
                           // driver's tensor-map encoder was found (their loads are TMA)
  MlaVerifySm90aSchedule sm90a_schedule = MlaVerifySm90aSchedule::kAuto;  // as configured
  DeviceLimits limits;           // as the tile choice sees the device (limit_to_family applied)
  int32_t* plan = nullptr;       // device, see mla_verify_plan.h
  float* partial_out = nullptr;  // device [partial_rows, 512]
  float* partial_lse = nullptr;  // device [partial_rows], log2 domain
  int64_t partial_rows = 0;
  size_t bytes = 0;         // device bytes held
  uint64_t plans_made = 0;  // PlanMlaVerify calls on this workspace (a plan names the one it is)
};

// What RunMlaVerify launches: the path, its grid and the shape it was made for. The plan kernel
// PlanMlaVerify enqueues writes the device part (per-request split bookkeeping, from the lengths
// on the device) into the workspace, or, for small batches on the sm_90a path (plan_in_block),
// the attention kernel makes it itself; RunMlaVerify refuses a plan that is not the workspace's
// latest, or params of another shape.
struct MlaVerifyPlan {
  MlaVerifyPath path = MlaVerifyPath::kSplitKv;
  int32_t batch = 0, s_q = 0, h_q = 0;
  int32_t tile = -1;          // the portable path's tile (mla::kTiles index); -1 on split_kv_sm90a
  int32_t row_tiles = 0;      // grid.x of the attention kernel: query-row tiles of a request
  int32_t num_parts = 0;      // grid.y: ranges of the flattened batch (one block per SM in all)
  bool combine_rows = false;  // combine with a warp per query row (few splits per request)
  // split_kv_sm90a: the tile's schedule (never kAuto in a plan).
  MlaVerifySm90aSchedule sm90a_schedule = MlaVerifySm90aSchedule::kAuto;
  // split_kv_sm90a with at most mla::kBlockPlanMaxBatch requests: no plan kernel; the attention
  // kernel's blocks plan themselves from the lengths on the device when RunMlaVerify's launch
  // runs, and one of them stores the plan into the workspace for the combine.
  bool plan_in_block = false;
  const MlaVerifyWorkspace* workspace = nullptr;
  uint64_t id = 0;  // workspace->plans_made when this plan was made
};

cudaError_t CreateMlaVerifyWorkspace(const MlaVerifyWorkspaceConfig& config,
                                     MlaVerifyWorkspace** out);
void DestroyMlaVerifyWorkspace(MlaVerifyWorkspace* workspace);

// The split path LaunchMlaVerify takes for s_q * h_q query rows on this workspace's device
// (kSplitKvSm90a where it exists and wins, see the definition).
MlaVerifyPath ChooseMlaVerifyPath(const MlaVerifyWorkspace& workspace, int32_t rows);

// The split_kv_sm90a schedule a plan on this workspace takes for s_q * h_q = `rows` query rows and
// `batch` requests: the workspace's forced schedule (swap-AB only where rows <= 32, the plan's
// choice elsewhere), else the measured choice (mla::UseSwapAbSchedule, mla::UseOnePageSchedule).
MlaVerifySm90aSchedule ChooseMlaVerifySm90aSchedule(const MlaVerifyWorkspace& workspace,
                                                    int32_t rows, int32_t batch);

// The portable tile kernel's tile for s_q * h_q = `rows` query rows on this workspace's device
// (mla::kTiles index, the deepest that fits its blocks; -1 when none does), and its name
// ("16x2": rows x key stages) for benchmarks and tests.
int32_t ChooseMlaVerifyTile(const MlaVerifyWorkspace& workspace, int32_t rows);
const char* MlaVerifyTileName(int32_t tile);

// Host-side checks of a launch's sizes and alignment: cudaSuccess or cudaErrorInvalidValue.
cudaError_t CheckMlaVerifyParams(const MlaVerifyParams& params, const MlaVerifyWorkspace* ws);

// The plan of a split path (kSplitKv or kSplitKvSm90a; the latter needs workspace->has_sm90a,
// else cudaErrorInvalidDeviceFunction) for params.batch / s_q / h_q and the lengths in
// params.cache_seqlens (read on the device): fills *plan and enqueues one small kernel (none for
// kSplitKvSm90a with at most mla::kBlockPlanMaxBatch requests: there each RunMlaVerify's
// attention kernel plans from the lengths as they are when it runs).
cudaError_t PlanMlaVerify(const MlaVerifyParams& params, MlaVerifyPath path,
                          MlaVerifyWorkspace* workspace, cudaStream_t stream, MlaVerifyPlan* plan);
// Attention + combine as planned (same batch, s_q, h_q and lengths; the pointers may differ,
// e.g. per layer).
cudaError_t RunMlaVerify(const MlaVerifyPlan& plan, const MlaVerifyParams& params,
                         cudaStream_t stream);
// Plan and run on the path ChooseMlaVerifyPath picks.
cudaError_t LaunchMlaVerify(const MlaVerifyParams& params, MlaVerifyWorkspace* workspace,
                            cudaStream_t stream);
// The baseline: no plan, no partials (the workspace is only for its launch settings).
cudaError_t LaunchMlaVerifyBaseline(const MlaVerifyParams& params,
                                    const MlaVerifyWorkspace* workspace, cudaStream_t stream);
// By path (plan + run for the split paths; kSplitKvSm90a needs workspace->has_sm90a, else
// cudaErrorInvalidDeviceFunction).
cudaError_t LaunchMlaVerifyPath(const MlaVerifyParams& params, MlaVerifyPath path,
                                MlaVerifyWorkspace* workspace, cudaStream_t stream);

}  // namespace probesidecar::kernels
