// Host-only parts of the MLA verify launchers: path names and the launch checks. Plain C++ with
// CUDA headers only, so that the CPU tests (CI) check them without device code.
#include <cstdint>

#include "kernels/blocks/alignment.h"
#include "kernels/mla_verify/mla_verify.h"
#include "kernels/mla_verify/mla_verify_plan.h"

namespace probesidecar::kernels {
namespace {

using blocks::Is16ByteAligned;

bool Mult8(int64_t stride) { return stride >= 0 && stride % 8 == 0; }

}  // namespace

const char* MlaVerifyPathName(MlaVerifyPath path) {
  switch (path) {
    case MlaVerifyPath::kSplitKv:
      return "split_kv";
    case MlaVerifyPath::kBaseline:
      return "baseline";
    case MlaVerifyPath::kSplitKvSm90a:
      return "split_kv_sm90a";
  }
  return "unknown";
}

const char* MlaVerifySm90aScheduleName(MlaVerifySm90aSchedule schedule) {
  switch (schedule) {
    case MlaVerifySm90aSchedule::kAuto:
      return "auto";
    case MlaVerifySm90aSchedule::kPagePairs:
      return "page_pairs";
    case MlaVerifySm90aSchedule::kOnePage:
      return "one_page";
    case MlaVerifySm90aSchedule::kSwapAb:
      return "swap_ab";
  }
  return "unknown";
}

MlaVerifyPath ChooseMlaVerifyPath(const MlaVerifyWorkspace& ws, int32_t rows) {
  // The sm_90a tile measured at or below the portable one's time for every row count and length
  // of the benchmark's sweep (16..1024 rows, bench/results/mla_verify.md), so it serves every
  // shape where it exists.
  (void)rows;
  return ws.has_sm90a ? MlaVerifyPath::kSplitKvSm90a : MlaVerifyPath::kSplitKv;
}

MlaVerifySm90aSchedule ChooseMlaVerifySm90aSchedule(const MlaVerifyWorkspace& ws, int32_t rows,
                                                    int32_t batch) {
  switch (ws.sm90a_schedule) {
    case MlaVerifySm90aSchedule::kPagePairs:
    case MlaVerifySm90aSchedule::kOnePage:
      return ws.sm90a_schedule;
    case MlaVerifySm90aSchedule::kSwapAb:
      if (mla::SwapAbFits(rows)) return MlaVerifySm90aSchedule::kSwapAb;
      break;
    case MlaVerifySm90aSchedule::kAuto:
      if (mla::UseSwapAbSchedule(rows, batch)) return MlaVerifySm90aSchedule::kSwapAb;
      break;
  }
  return mla::UseOnePageSchedule(rows, batch) ? MlaVerifySm90aSchedule::kOnePage
                                              : MlaVerifySm90aSchedule::kPagePairs;
}

int32_t ChooseMlaVerifyTile(const MlaVerifyWorkspace& ws, int32_t rows) {
  return mla::ChooseTile(rows, mla::TileDeviceFrom(ws.limits)).index;
}

const char* MlaVerifyTileName(int32_t tile) {
  static constexpr const char* kNames[mla::kNumTiles] = {"16x2", "32x4", "32x3", "64x3", "64x2"};
  return tile >= 0 && tile < mla::kNumTiles ? kNames[tile] : "none";
}

cudaError_t CheckMlaVerifyParams(const MlaVerifyParams& p, const MlaVerifyWorkspace* ws) {
  if (ws == nullptr) return cudaErrorInvalidValue;
  if (p.batch < 1 || p.batch > ws->max_batch) return cudaErrorInvalidValue;
  if (p.s_q < 1 || p.s_q > kMlaMaxSq) return cudaErrorInvalidValue;
  if (p.h_q != 16 && p.h_q != 32 && p.h_q != 64 && p.h_q != 128) return cudaErrorInvalidValue;
  if (p.q == nullptr || p.kv_cache == nullptr || p.block_table == nullptr ||
      p.cache_seqlens == nullptr || p.out == nullptr) {
    return cudaErrorInvalidValue;
  }
  // 16-byte copies and stores: base pointers and every row start 16-byte aligned.
  if (!Is16ByteAligned(p.q) || !Is16ByteAligned(p.kv_cache) || !Is16ByteAligned(p.out)) {
    return cudaErrorInvalidValue;
  }
  if (!Mult8(p.q_batch_stride) || !Mult8(p.q_token_stride) || !Mult8(p.q_head_stride) ||
      !Mult8(p.kv_page_stride) || !Mult8(p.kv_row_stride) || !Mult8(p.out_batch_stride) ||
      !Mult8(p.out_token_stride) || !Mult8(p.out_head_stride)) {
    return cudaErrorInvalidValue;
  }
  if (p.kv_row_stride < kMlaHeadDimQk || p.q_head_stride < kMlaHeadDimQk ||
      p.out_head_stride < kMlaHeadDimV || p.kv_page_stride < kMlaPageSize * p.kv_row_stride) {
    return cudaErrorInvalidValue;
  }
  if (p.block_table_batch_stride < p.max_pages || p.max_pages < 1 || p.num_pages < 0) {
    return cudaErrorInvalidValue;
  }
  if (!(p.softmax_scale > 0.0f)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace probesidecar::kernels
