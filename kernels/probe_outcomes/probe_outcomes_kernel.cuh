// The count of probe outcomes on the GPU (probe_outcomes.h has the semantics and the launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/blocks/grid_dependency.cuh"
#include "kernels/probe_outcomes/probe_outcomes.h"

namespace probesidecar::kernels::probe_outcomes_detail {

// Probes per block (the columns of one tile); a block has up to kMaxThreads threads (up to
// kNarrowThreads for a tile of at most kNarrowTile probes), a whole number of rows of the tile
// per pass, and shared memory sized to the tile: launched early as a programmatic dependent, a
// small block fits beside the scoring kernel's and waits resident, instead of starting only once
// they have gone. Narrow tiles gain from it; wider ones do not: their blocks would each add a
// histogram of many probes to the counters, twice as many blocks for the same rows (H200,
// bench/results/outcomes_8721e7c.md and outcomes_ccd07fb.md: 128 and 256 threads).
inline constexpr int kTileProbes = 128;
inline constexpr int kMaxThreads = 256;
inline constexpr int kNarrowTile = 4;
inline constexpr int kNarrowThreads = 128;
// Rows each thread loads before it counts them (independent loads in flight).
inline constexpr int kUnroll = 4;
// Blocks in all: each adds its tile's histograms to the counters once, so more blocks means more
// global atomics on the same words.
inline constexpr int kMaxBlocks = 512;
// A request of at most this many rows is counted straight into the counters (each word gets at
// most this many adds): no histogram in shared memory, no pass over it after a barrier.
inline constexpr int kDirectRows = 64;

// Whether a block's threads leave their sums and counts in shared memory, added up per probe
// column in a fixed order after the barrier, rather than adding them into one shared word per
// column: with many threads to a column (a narrow tile) those adds serialised, a double's add as
// a compare-and-swap loop (H200, bench/results/outcomes_d7ff9e8.md against outcomes_85c1b88.md:
// R = 64-8192 at P <= 64 took 1-5 µs less); with few, the per-thread records cost more than they
// saved (1-2 µs more at R = 1024, P >= 64).
__host__ __device__ constexpr bool CountsPerThread(int rows_per_pass) { return rows_per_pass > 4; }

// The dynamic shared memory of a block of `threads` threads, `tile_width` probes and `num_bounds`
// bounds: per probe its sum of finite scores (double), fired and non-finite counts and histogram;
// where CountsPerThread, per thread its sum, fired and non-finite counts; then the bounds.
__host__ __device__ constexpr size_t CountSharedBytes(int threads, int tile_width, int num_bounds) {
  const size_t per = sizeof(double) + 2 * sizeof(uint32_t);
  return (CountsPerThread(threads / tile_width) ? static_cast<size_t>(threads) * per : 0) +
         static_cast<size_t>(tile_width) * (per + sizeof(uint32_t) * (num_bounds + 1)) +
         sizeof(float) * num_bounds;
}

// The bucket of a finite score in `bounds` [num_bounds] (shared memory): the first b with
// score <= bounds[b], else num_bounds.
__device__ __forceinline__ int Bucket(const float* bounds, int num_bounds, float score) {
  int lo = 0, hi = num_bounds;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (score <= bounds[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Grid: (row groups, probe tiles); block: tile_width x rows_per_pass threads, tile_width =
// min(P, kTileProbes); dynamic shared memory CountSharedBytes(threads, tile_width, B). Thread t
// counts probe column t % tile_width of the tile over the rows (t / tile_width) + k *
// rows_per_pass * gridDim.x, kUnroll rows at a time, in registers and (past kDirectRows rows) a
// shared-memory histogram, which the block then adds to the slot's counters with its threads'
// sums and counts (nonzero words only); at most kDirectRows rows, each score's bucket and each
// thread's sums go to the counters directly. The block's non-finite scores go to the running
// total; where the descriptor asks, the request's non-finite count is published (by the last
// block to finish, which resets the scratch).
// Everything that does not depend on the scores (the descriptor, the thresholds, the bounds, the
// zeroed histogram) is ready before the grid-dependency wait. At most 64 registers a thread (4
// blocks of kMaxThreads an SM): a bounded footprint beside the scoring kernel's blocks, and no
// spill (ptxas spills at its own choice of 48).
__global__ void __launch_bounds__(kMaxThreads, 4)
    CountProbeOutcomesKernel(const __grid_constant__ CountProbeOutcomesParams p) {
  extern __shared__ __align__(8) unsigned char shared[];
  __shared__ uint32_t block_non_finite;
  __shared__ uint32_t block_rows;  // counted rows, with group counts
  __shared__ bool last_block;

  const ProbeOutcomeDescriptor d = *p.descriptor;
  const int tile_width = p.num_probes < kTileProbes ? p.num_probes : kTileProbes;
  const int buckets = p.num_bounds + 1;
  const int record = ProbeOutcomeLayout::kBuckets + buckets;
  const int tile_begin = static_cast<int>(blockIdx.y) * kTileProbes;
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int rows_per_pass = threads / tile_width;
  const bool per_thread = CountsPerThread(rows_per_pass);
  // Doubles first, then 32-bit words: [threads or 0] sums, [tile_width] sums, then the counts.
  double* thread_sum = reinterpret_cast<double*>(shared);
  double* sum = thread_sum + (per_thread ? threads : 0);
  uint32_t* thread_fired = reinterpret_cast<uint32_t*>(sum + tile_width);
  uint32_t* thread_non_finite = thread_fired + (per_thread ? threads : 0);
  uint32_t* fired = thread_non_finite + (per_thread ? threads : 0);
  uint32_t* non_finite = fired + tile_width;
  uint32_t* histogram = non_finite + tile_width;
  float* bounds = reinterpret_cast<float*>(histogram + tile_width * buckets);
  const bool counting = d.counters != nullptr;
  const bool direct = d.num_rows <= kDirectRows;
  if (counting && !direct) {
    for (int i = tid; i < tile_width * buckets; i += threads) histogram[i] = 0;
    for (int i = tid; i < tile_width; i += threads) {
      fired[i] = 0;
      non_finite[i] = 0;
      sum[i] = 0;
    }
  }
  for (int i = tid; i < p.num_bounds; i += threads) bounds[i] = __ldg(p.bounds + i);
  const int column = tid % tile_width;
  const int probe = tile_begin + column;
  const bool active = probe < p.num_probes && tid < tile_width * rows_per_pass;
  const float threshold = active ? __ldg(p.thresholds + probe) : 0.0f;
  if (tid == 0) {
    block_non_finite = 0;
    block_rows = 0;
    // Rows first (when every row counts), so that a reader of the counters never sees more fired
    // than scored.
    if (counting && d.group_counts == nullptr && blockIdx.x == 0 && blockIdx.y == 0 &&
        d.num_rows > 0) {
      atomicAdd(d.counters, static_cast<unsigned long long>(d.num_rows));
    }
  }
  __syncthreads();
  // Launched as a programmatic dependent, all of the above overlaps the scoring kernel's tail:
  // the scores are read only once it has finished (a no-op in plain stream order). The
  // descriptor was written before that kernel started, so it is visible already.
  blocks::GridDependencyWait();

  // This thread's probe's record in the counters (the direct adds').
  unsigned long long* const probe_record =
      counting ? d.counters + 1 + static_cast<int64_t>(probe) * record : nullptr;
  const int64_t stride = static_cast<int64_t>(rows_per_pass) * gridDim.x;
  uint32_t my_fired = 0, my_non_finite = 0;
  double my_sum = 0;
  if (active) {
    for (int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_pass + tid / tile_width;
         first < d.num_rows; first += kUnroll * stride) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = first + u * stride;
        v[u] = r < d.num_rows ? d.scores[r * d.scores_row_stride + probe] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = first + u * stride;
        if (r >= d.num_rows) break;
        const float s = v[u];
        if (d.copy_to != nullptr) d.copy_to[r * d.copy_row_stride + probe] = s;
        if (d.group_counts != nullptr) {
          // Padding rows of a group are copied, never counted.
          const int64_t group = r / d.group_rows;
          if (r - group * d.group_rows >= __ldg(d.group_counts + group)) continue;
          if (probe == 0) atomicAdd(&block_rows, 1u);
        }
        if (!isfinite(s)) {
          ++my_non_finite;
          continue;
        }
        if (!counting) continue;
        my_sum += s;
        my_fired += s >= threshold ? 1u : 0u;  // false for a NaN threshold
        const int b = Bucket(bounds, p.num_bounds, s);
        if (direct) {
          atomicAdd(probe_record + ProbeOutcomeLayout::kBuckets + b, 1ull);
        } else {
          atomicAdd(&histogram[column * buckets + b], 1u);
        }
      }
    }
    if (counting && direct) {
      if (my_sum != 0) atomicAdd(reinterpret_cast<double*>(probe_record), my_sum);
      if (my_fired != 0) atomicAdd(probe_record + ProbeOutcomeLayout::kFired, 1ull * my_fired);
      if (my_non_finite != 0) {
        atomicAdd(probe_record + ProbeOutcomeLayout::kNonFinite, 1ull * my_non_finite);
      }
    }
  }
  if (counting && !direct && per_thread) {
    thread_sum[tid] = my_sum;
    thread_fired[tid] = my_fired;
    thread_non_finite[tid] = my_non_finite;
  } else if (counting && !direct && active) {
    if (my_fired != 0) atomicAdd(&fired[column], my_fired);
    if (my_non_finite != 0) atomicAdd(&non_finite[column], my_non_finite);
    if (my_sum != 0) atomicAdd(&sum[column], my_sum);
  }
  // (Blocks need not be whole warps, so no warp shuffle: non-finite scores are rare.)
  if (my_non_finite != 0) atomicAdd(&block_non_finite, my_non_finite);
  __syncthreads();

  if (counting) {
    if (tid == 0 && block_rows != 0) {
      atomicAdd(d.counters, static_cast<unsigned long long>(block_rows));
    }
    if (!direct) {
      // This tile's probes: [sum, fired, non-finite, buckets...] each, nonzero words only (per
      // thread records added up over the column's threads in row order).
      const int width =
          p.num_probes - tile_begin < tile_width ? p.num_probes - tile_begin : tile_width;
      for (int i = tid; i < width * record; i += threads) {
        const int c = i / record, field = i % record;
        unsigned long long* word =
            d.counters + 1 + static_cast<int64_t>(tile_begin + c) * record + field;
        if (field == ProbeOutcomeLayout::kSum) {
          double total = sum[c];
          if (per_thread) {
            for (int r = 0; r < rows_per_pass; ++r) total += thread_sum[r * tile_width + c];
          }
          if (total != 0) atomicAdd(reinterpret_cast<double*>(word), total);
          continue;
        }
        uint32_t n;
        if (field == ProbeOutcomeLayout::kFired || field == ProbeOutcomeLayout::kNonFinite) {
          const bool is_fired = field == ProbeOutcomeLayout::kFired;
          n = is_fired ? fired[c] : non_finite[c];
          if (per_thread) {
            const uint32_t* part = is_fired ? thread_fired : thread_non_finite;
            for (int r = 0; r < rows_per_pass; ++r) n += part[r * tile_width + c];
          }
        } else {
          n = histogram[c * buckets + field - ProbeOutcomeLayout::kBuckets];
        }
        if (n != 0) atomicAdd(word, static_cast<unsigned long long>(n));
      }
    }
  }

  if (tid == 0 && block_non_finite != 0 && d.add_to_total != 0) {
    atomicAdd(p.non_finite_total, static_cast<unsigned long long>(block_non_finite));
  }
  if (d.publish_count == 0) return;
  // The request's count: a lone block has it; several add theirs up and the last to finish
  // publishes (a ticket and fences: a cost only the requests that need the count pay).
  if (gridDim.x * gridDim.y == 1) {
    if (tid == 0) *p.request_non_finite = block_non_finite;
    return;
  }
  if (tid == 0) {
    if (block_non_finite != 0) atomicAdd(&p.scratch[0], block_non_finite);
    __threadfence();
    last_block = atomicAdd(&p.scratch[1], 1u) == gridDim.x * gridDim.y - 1;
  }
  __syncthreads();
  if (last_block && tid == 0) {
    __threadfence();
    *p.request_non_finite = atomicAdd(&p.scratch[0], 0u);
    p.scratch[0] = 0;
    p.scratch[1] = 0;
  }
}

}  // namespace probesidecar::kernels::probe_outcomes_detail
