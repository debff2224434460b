// The tap's write and close kernels (tap_write.h has the ring and its counters).
#pragma once

#include <cstdint>

#include "kernels/tap_write/tap_write.h"

namespace probesidecar::kernels {

inline constexpr int kTapWriteThreads = 256;

// Grid (n, blocks per row), kTapWriteThreads threads; `Unit` is the widest copy (16, 8, 4 or 2
// bytes) that the source, its row stride and the row length are all aligned to. Thread 0 of each
// block reads the slot, every block copies its part of one row, then takes a ticket; the block
// with the last ticket (every other block has read the slot by then: each read the counters
// before its fenced ticket) records the row count and advances the counters, and resets the
// ticket for the next launch. No block waits for another, so any grid size runs.
template <typename Unit>
__global__ void __launch_bounds__(kTapWriteThreads)
    TapWriteKernel(const __grid_constant__ TapWriteParams p) {
  __shared__ int64_t slot_s, limit_s;
  if (threadIdx.x == 0) {
    slot_s = p.meta[kTapMetaNextSlot];
    limit_s = p.meta[kTapMetaLimit];
  }
  __syncthreads();
  const int64_t slot = slot_s, limit = limit_s;
  const int64_t target = slot < limit ? slot : p.overflow_slot;
  const int64_t element = common::DTypeSize(p.dtype);
  const int64_t row = blockIdx.x;
  const int64_t units = int64_t{p.hidden} * element / static_cast<int64_t>(sizeof(Unit));
  const Unit* src = reinterpret_cast<const Unit*>(static_cast<const char*>(p.src) +
                                                  row * p.src_row_stride * element);
  Unit* dst = reinterpret_cast<Unit*>(static_cast<char*>(p.slots) +
                                      ((target * p.max_batch + row) * p.hidden) * element);
  for (int64_t i = int64_t{blockIdx.y} * blockDim.x + threadIdx.x; i < units;
       i += int64_t{gridDim.y} * blockDim.x) {
    dst[i] = src[i];
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence();
  const auto blocks = static_cast<unsigned long long>(gridDim.x) * gridDim.y;
  const unsigned long long ticket =
      atomicAdd(reinterpret_cast<unsigned long long*>(p.meta + kTapMetaTicket), 1ull);
  if (ticket != blocks - 1) return;
  __threadfence();
  int64_t count = p.n;
  if (p.num_rows32 != nullptr) count = *p.num_rows32;
  if (p.num_rows64 != nullptr) count = *p.num_rows64;
  count = count < 0 ? 0 : (count > p.n ? p.n : count);
  p.counts[target] = static_cast<int32_t>(count);
  p.meta[kTapMetaNextSlot] = slot + 1 < limit ? slot + 1 : limit;
  p.meta[kTapMetaWrites] += 1;
  p.meta[kTapMetaTicket] = 0;
}

// Grid 1, one thread.
__global__ void TapCloseKernel(const __grid_constant__ TapCloseParams p) {
  if (p.record_writes) p.meta[kTapMetaHalfWrites + p.half] = p.meta[kTapMetaWrites];
  p.meta[kTapMetaNextSlot] = p.next_base;
  p.meta[kTapMetaLimit] = p.next_limit;
  p.meta[kTapMetaWrites] = 0;
}

}  // namespace probesidecar::kernels
