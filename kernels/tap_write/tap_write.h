// The client side of a windowed tap: a decode loop copies each step's rows into the next slot of a
// ring it owns, and a sidecar scores one window of K slots per request. The slot a write goes to
// is named by a counter in device memory, so the write can be captured in the caller's CUDA graph
// and every replay writes the next slot with no host work; closing a window (once per K steps,
// on the host's count) points the counter at the other half of the ring.
//
// The ring (one allocation, TapRingLayout below) has 2K + 1 slots of [max_batch, H] rows: slots
// [0, K) are half 0, [K, 2K) half 1, and slot 2K is a spare that takes the writes past a window's
// end (so a window never reads rows of the next one; the write count tells the host).
//
// docs/tap-protocol.md is the protocol: the ring's parts (TapRingLayout below), its counters
// (kTapMeta*), the slot rules (2K + 1 slots in two halves and a spare, saturation at the limit,
// closes, counts) and what a reader reads of a window (TapWindowParts). The Python client's
// writer (client/python/probe_sidecar/tap_op.py: the same names, META_NEXT_SLOT for
// kTapMetaNextSlot, ...) is held to it by tests/python/test_tap_protocol.py, which compares what
// tap_protocol_tool prints of this header with the Python side, and by the cross-language GPU test
// (tap_protocol_gpu_test, tests/python/test_gpu_tap_protocol.py). The counters and the small parts:
//
//   meta [kTapMetaSize] int64
//     [kTapMetaNextSlot]    the slot the next write goes to; stops at the limit
//     [kTapMetaLimit]       the end (exclusive) of the current window's slots
//     [kTapMetaTicket]      the write kernel's blocks count themselves here (0 between launches)
//     [kTapMetaWrites]      writes in the current window, those past its end included
//     [kTapMetaHalfWrites + h]  the write count of half h's last closed window
//     [kTapMetaArmed]       gather mode (the Python operator's): rows armed for the next write,
//                           kTapArmedOff, or kTapArmedFollow; never read by the kernels here
//     [kTapMetaRest]        what kTapMetaArmed returns to after a gather write
//   counts [2K + 1] int32   rows written at each slot
//   gather [max_batch] int32  gather mode's row indices (the Python operator's)
//
// Plain C++ and CUDA runtime types only (no gRPC, protobuf or absl).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>

#include "common/dtype.h"

namespace probesidecar::kernels {

inline constexpr int kTapMetaNextSlot = 0;
inline constexpr int kTapMetaLimit = 1;
inline constexpr int kTapMetaTicket = 2;
inline constexpr int kTapMetaWrites = 3;
inline constexpr int kTapMetaHalfWrites = 4;  // and 5: one per half
inline constexpr int kTapMetaArmed = 6;
inline constexpr int kTapMetaRest = 7;
inline constexpr int kTapMetaSize = 8;

// Values of meta[kTapMetaArmed] and meta[kTapMetaRest] other than a row count (>= 0).
inline constexpr int64_t kTapArmedOff = -1;     // gather writes write nothing
inline constexpr int64_t kTapArmedFollow = -2;  // gather writes follow the engine's `starts`

// Every part of the ring starts at a multiple of this (bytes).
inline constexpr int64_t kTapRingAlign = 256;

// A new ring's counters: the first window is half 0, nothing written, not armed.
inline constexpr std::array<int64_t, kTapMetaSize> TapInitialMeta(int32_t window) {
  std::array<int64_t, kTapMetaSize> meta{};
  meta[kTapMetaNextSlot] = 0;
  meta[kTapMetaLimit] = window;
  meta[kTapMetaArmed] = kTapArmedOff;
  meta[kTapMetaRest] = kTapArmedOff;
  return meta;
}

// One decode step's write: rows [0, n) of `src` into the slot meta[kTapMetaNextSlot] names (the
// spare slot once it has reached the limit), counts[slot] = the row count, then the slot
// advances (saturating at the limit) and the window's write count goes up by one.
struct TapWriteParams {
  const void* src = nullptr;  // [n, src_row_stride] elements of `dtype`, columns contiguous
  void* slots = nullptr;      // [overflow_slot + 1, max_batch, hidden] elements of `dtype`
  int64_t* meta = nullptr;    // [kTapMetaSize]
  int32_t* counts = nullptr;  // [overflow_slot + 1]
  // The row count to record, read on the GPU (a batch padded to a graph's size writes n rows of
  // which this many are real); at most one of the two, neither: n. Clamped to [0, n].
  const int32_t* num_rows32 = nullptr;  // [1]
  const int64_t* num_rows64 = nullptr;  // [1]
  int64_t src_row_stride = 0;           // elements between consecutive rows of src, >= hidden
  int32_t n = 0;                        // rows copied, 1..max_batch
  int32_t max_batch = 0;
  int32_t hidden = 0;         // H
  int32_t overflow_slot = 0;  // 2K: the spare slot
  common::DType dtype = common::DType::kBFloat16;
};

// Grid (n, blocks per row), 256 threads; one launch, capturable. cudaErrorInvalidValue for params
// TapWriteParamsValid refuses (nothing is launched then).
cudaError_t LaunchTapWrite(const TapWriteParams& params, cudaStream_t stream);

// Closing half `half`'s window: meta[kTapMetaHalfWrites + half] = meta[kTapMetaWrites] (unless
// !record_writes), the next writes go to [next_base, next_limit), and the write count starts again
// from 0. next_limit == next_base diverts the next window: all its writes go to the spare slot.
struct TapCloseParams {
  int64_t* meta = nullptr;  // [kTapMetaSize]
  int32_t half = 0;         // 0 or 1
  int64_t next_base = 0;    // the next window's first slot
  int64_t next_limit = 0;   // the end (exclusive) of its slots, >= next_base
  // False for the close of a diverted (lost) window: the half's last window may still be read,
  // its write count with it, so the count stays.
  bool record_writes = true;
};

// One thread; capturable. cudaErrorInvalidValue for params TapCloseParamsValid refuses.
cudaError_t LaunchTapClose(const TapCloseParams& params, cudaStream_t stream);

// Loads every variant of the write and close kernels on the current device now: with lazy module
// loading a kernel is otherwise loaded at its first launch, which may be inside a caller's graph
// capture. Call it once per device before the first write.
cudaError_t PrepareTapKernels();

inline bool TapWriteParamsValid(const TapWriteParams& p) {
  const bool dtype_ok = p.dtype == common::DType::kFloat32 || p.dtype == common::DType::kFloat16 ||
                        p.dtype == common::DType::kBFloat16;
  if (!dtype_ok || p.src == nullptr || p.slots == nullptr || p.meta == nullptr ||
      p.counts == nullptr || (p.num_rows32 != nullptr && p.num_rows64 != nullptr)) {
    return false;
  }
  const auto element = static_cast<uintptr_t>(common::DTypeSize(p.dtype));
  return p.n >= 1 && p.n <= p.max_batch && p.hidden >= 1 && p.src_row_stride >= p.hidden &&
         p.overflow_slot >= 1 && reinterpret_cast<uintptr_t>(p.src) % element == 0 &&
         reinterpret_cast<uintptr_t>(p.slots) % element == 0;
}

inline bool TapCloseParamsValid(const TapCloseParams& p) {
  return p.meta != nullptr && (p.half == 0 || p.half == 1) && p.next_base >= 0 &&
         p.next_limit >= p.next_base;
}

// Where the parts of a tap's ring lie in its one allocation (byte offsets, each part
// kTapRingAlign-aligned, in this order, each part's size rounded up to kTapRingAlign): what the
// client allocates and registers, and what its requests name (docs/tap-protocol.md).
struct TapRingLayout {
  int64_t slots = 0;    // [2K + 1, max_batch, H] of the rows' dtype
  int64_t scores = -1;  // [2K, max_batch, P] float32, written by the sidecar (-1: no such part)
  int64_t rows = -1;    // [K * max_batch] int32 = 0, 1, ...: every window's device rows (-1: none)
  int64_t counts = 0;   // [2K + 1] int32
  int64_t gather = 0;   // [max_batch] int32: gather mode's row indices
  int64_t meta = 0;     // [kTapMetaSize] int64
  int64_t total_bytes = 0;
  int64_t slot_bytes = 0;  // one slot: max_batch * H elements
  // What it was made for.
  int32_t window = 0, max_batch = 0, hidden = 0, num_probes = 0, element_size = 0;
  common::DType dtype = common::DType::kFloat32;  // the rows'
};

// `device_scores`: with the scores and rows parts (a CUDA ring, whose Score reads its rows and
// writes its scores in the ring); without (a host ring whose windows travel inline).
inline TapRingLayout MakeTapRingLayout(int32_t window, int32_t max_batch, int32_t hidden,
                                       int32_t num_probes, common::DType dtype,
                                       bool device_scores = true) {
  const int64_t k2 = 2 * int64_t{window};
  TapRingLayout layout;
  layout.window = window;
  layout.max_batch = max_batch;
  layout.hidden = hidden;
  layout.num_probes = num_probes;
  layout.element_size = common::DTypeSize(dtype);
  layout.dtype = dtype;
  layout.slot_bytes = int64_t{max_batch} * hidden * layout.element_size;
  int64_t at = 0;
  auto place = [&at](int64_t bytes) {
    const int64_t start = at;
    at += (bytes + kTapRingAlign - 1) / kTapRingAlign * kTapRingAlign;
    return start;
  };
  layout.slots = place((k2 + 1) * layout.slot_bytes);
  if (device_scores) {
    layout.scores = place(k2 * max_batch * num_probes * int64_t{4});
    layout.rows = place(int64_t{window} * max_batch * 4);
  }
  layout.counts = place((k2 + 1) * 4);
  layout.gather = place(int64_t{max_batch} * 4);
  layout.meta = place(kTapMetaSize * 8);
  layout.total_bytes = at;
  return layout;
}

// What a reader reads of a closed window of `steps` (1..K) steps in half `half` (byte offsets into
// the ring): the activations the ScoreRequest names ([rows, H], row stride H), its device rows
// ([rows] int32), its counted rows ([steps] int32: the rows each step wrote; the rest of a slot is
// padding), its output ([rows, P] float32, row stride P) and the window's write count (int64, to
// compare with `steps`). scores and device_rows are -1 without the device parts.
struct TapWindowParts {
  int64_t first_slot = 0;  // half * K
  int64_t rows = 0;        // steps * max_batch
  int64_t activations = 0;
  int64_t device_rows = -1;
  int64_t counts = 0;
  int64_t scores = -1;
  int64_t writes = 0;
};

inline TapWindowParts MakeTapWindowParts(const TapRingLayout& layout, int32_t half, int32_t steps) {
  TapWindowParts w;
  w.first_slot = int64_t{half} * layout.window;
  w.rows = int64_t{steps} * layout.max_batch;
  w.activations = layout.slots + w.first_slot * layout.slot_bytes;
  w.device_rows = layout.rows;
  w.counts = layout.counts + w.first_slot * 4;
  if (layout.scores >= 0) {
    w.scores = layout.scores + w.first_slot * layout.max_batch * layout.num_probes * 4;
  }
  w.writes = layout.meta + int64_t{kTapMetaHalfWrites + half} * 8;
  return w;
}

// The fixed part of every write into the ring laid out as `layout` at `ring` (host or device
// memory): its slots, counters, shape and dtype. A write adds its rows (src, n, src_row_stride)
// and, where the batch is padded, its row count on the GPU.
inline TapWriteParams TapRingWriteParams(const TapRingLayout& layout, void* ring) {
  auto* base = static_cast<uint8_t*>(ring);
  TapWriteParams p;
  p.slots = base + layout.slots;
  p.meta = reinterpret_cast<int64_t*>(base + layout.meta);
  p.counts = reinterpret_cast<int32_t*>(base + layout.counts);
  p.max_batch = layout.max_batch;
  p.hidden = layout.hidden;
  p.overflow_slot = 2 * layout.window;
  p.dtype = layout.dtype;
  return p;
}

}  // namespace probesidecar::kernels
