// The outcome count fused into a scoring kernel's final stores: a block tallies the scores it
// writes in shared memory and adds the tally to the request's counters once, so that the scores
// are never read again (probe_outcomes.h has the semantics, OutcomeEpilogueParams the inputs).
//
// Use, in a block whose threads each write scores of at most kSlots probe columns (a slot is one
// of a thread's columns: the same slot names the same probe until the thread's next Flush):
//
//   OutcomeTallyBegin(params, shared, col_begin, cols, num_probes);  // every thread; barriers
//   OutcomeTally<kSlots> tally(params, shared);
//   ... tally.Add(slot, row, probe, score) for each score the thread writes ...
//   ... (tally.Flush() after each round of a loop: the thread's part out of registers) ...
//   tally.End();                                                     // every thread; barriers
//
// `shared` holds OutcomeTallyBytes(cols, B) bytes, 8-byte aligned (memory the kernel no longer
// reads will do: Begin starts with a barrier); the block's probes are the `cols` <= num_probes
// columns from col_begin on, wrapping past num_probes (an elementwise kernel's block of
// consecutive (row, probe) elements), so a tile kernel passes min(its tile, P - col_begin).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/probe_outcomes/probe_outcomes.h"

namespace probesidecar::kernels {

// The bucket of a finite score in `bounds` [num_bounds]: the first b with score <= bounds[b],
// else num_bounds.
__device__ __forceinline__ int ScoreBucketOf(const float* bounds, int num_bounds, float score) {
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

// What a block's tally reads for every score, kept in its shared memory (not in registers, which
// the scoring kernel's main loop needs).
struct OutcomeTallyHeader {
  ProbeOutcomeDescriptor d;
  const float* thresholds;
  const uint8_t* invalid_rows;
  unsigned long long* non_finite_total;
  int32_t col_begin, cols, num_probes, num_bounds;
  uint32_t rows, non_finite;  // the block's counted rows and non-finite scores
  int32_t on;                 // the request counts or copies its scores
  int32_t pad_;
};

// Shared memory of a tally over `cols` probe columns and `num_bounds` bounds: the header, then per
// column its sum (double), fired and non-finite counts and histogram, then the bounds.
__host__ __device__ constexpr size_t OutcomeTallyBytes(int cols, int num_bounds) {
  return sizeof(OutcomeTallyHeader) +
         static_cast<size_t>(cols) * (sizeof(double) + sizeof(uint32_t) * (num_bounds + 3)) +
         sizeof(float) * num_bounds;
}

// Every thread of the block, before any Add: reads the request's descriptor, zeroes the tally and
// loads the bounds, between two barriers. Nothing (no barrier) without a descriptor; a descriptor
// that neither counts nor copies leaves the tally off, which the whole block sees alike.
__device__ inline void OutcomeTallyBegin(const OutcomeEpilogueParams& p, void* shared,
                                         int col_begin, int cols, int num_probes) {
  if (p.descriptor == nullptr) return;
  const ProbeOutcomeDescriptor& d = *p.descriptor;
  const bool on = d.counters != nullptr || d.copy_to != nullptr || d.add_to_total != 0;
  __syncthreads();  // whatever `shared` held before is no longer read
  auto* h = static_cast<OutcomeTallyHeader*>(shared);
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  if (tid == 0) {
    h->on = on ? 1 : 0;
    h->d = d;
    h->thresholds = p.thresholds;
    h->invalid_rows = p.invalid_rows;
    h->non_finite_total = p.non_finite_total;
    h->col_begin = col_begin;
    h->cols = cols;
    h->num_probes = num_probes;
    h->num_bounds = p.num_bounds;
    h->rows = 0;
    h->non_finite = 0;
  }
  if (on) {
    double* sum = reinterpret_cast<double*>(h + 1);
    for (int i = tid; i < cols; i += threads) sum[i] = 0.0;
    uint32_t* words = reinterpret_cast<uint32_t*>(sum + cols);  // fired, non-finite, histogram
    for (int i = tid; i < cols * (p.num_bounds + 3); i += threads) words[i] = 0;
    float* bounds = reinterpret_cast<float*>(words + cols * (p.num_bounds + 3));
    for (int i = tid; i < p.num_bounds; i += threads) bounds[i] = __ldg(p.bounds + i);
  }
  __syncthreads();
}

// A thread's view of its block's tally (after OutcomeTallyBegin): what it holds in registers is
// its own part since the last Flush, so a kernel may make one per round of its loop.
template <int kSlots, bool kRowLanes = false>
class OutcomeTally {
 public:
  // `begun`: whether this block called OutcomeTallyBegin (false: the view is off).
  __device__ OutcomeTally(const OutcomeEpilogueParams& p, void* shared, bool begun = true)
      : h_(static_cast<OutcomeTallyHeader*>(shared)) {
    on_ = begun && p.descriptor != nullptr && h_->on != 0;
    Reset();
  }

  __device__ bool on() const { return on_; }

  // Score s of (row, probe), as the kernel stores it; `slot` < kSlots names the thread's column
  // (the same slot, the same probe, until the next Flush).
  __device__ __forceinline__ void Add(int slot, int64_t row, int probe, float s) {
    if (!on_) return;
    const ProbeOutcomeDescriptor& d = h_->d;
    if (h_->invalid_rows != nullptr && h_->invalid_rows[row] != 0) s = __int_as_float(0x7fc00000);
    if (d.copy_to != nullptr) d.copy_to[row * d.copy_row_stride + probe] = s;
    if (d.group_counts != nullptr) {
      // Padding rows of a group are copied, never counted.
      const int64_t group = row / d.group_rows;
      if (row - group * d.group_rows >= __ldg(d.group_counts + group)) return;
    }
    if (probe == 0) ++rows_;
    probe_[slot] = probe;
    if (!isfinite(s)) {
      ++non_finite_[slot];
      return;
    }
    if (d.counters == nullptr) return;
    sum_[slot] += s;
    fired_[slot] += s >= __ldg(h_->thresholds + probe) ? 1u : 0u;  // false for a NaN threshold
    const int b = ScoreBucketOf(Bounds(), h_->num_bounds, s);
    atomicAdd(Histogram() + Column(probe) * (h_->num_bounds + 1) + b, 1u);
  }

  // This thread's sums and counts so far into the block's tally (no barrier): a kernel whose
  // threads write scores in a loop calls it each round, so that nothing of the tally stays in
  // registers through its main loop. With kRowLanes (the mma fragment layout: lanes l, l ^ 4,
  // l ^ 8 and l ^ 16 hold the same columns of other rows in the same slots), the warp adds its
  // lanes' parts up first and one lane in eight adds them to shared memory: every lane of the
  // warp calls it.
  __device__ __forceinline__ void Flush() {
    if (!on_) return;
    const int cols = h_->cols;
    double* sum = Sums();
    uint32_t* fired = reinterpret_cast<uint32_t*>(sum + cols);
    uint32_t* non_finite = fired + cols;
    uint32_t block_non_finite = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      int probe = probe_[s];
      float part = sum_[s];
      // Fired in the low half, non-finite in the high: a slot sees a few scores between flushes.
      uint32_t counts = fired_[s] | (non_finite_[s] << 16);
      if constexpr (kRowLanes) {
#pragma unroll
        for (int offset = 4; offset < 32; offset <<= 1) {
          probe = max(probe, __shfl_xor_sync(0xffffffffu, probe, offset));
          part += __shfl_xor_sync(0xffffffffu, part, offset);
          counts += __shfl_xor_sync(0xffffffffu, counts, offset);
        }
      }
      if (probe >= 0 && (!kRowLanes || (threadIdx.x & 31) < 4)) {
        const int c = Column(probe);
        const uint32_t n_fired = counts & 0xffffu, n_non_finite = counts >> 16;
        block_non_finite += n_non_finite;
        if (n_non_finite != 0) atomicAdd(non_finite + c, n_non_finite);
        if (n_fired != 0) atomicAdd(fired + c, n_fired);
        if (part != 0.0f) atomicAdd(sum + c, static_cast<double>(part));
      }
    }
    if (rows_ != 0) atomicAdd(&h_->rows, rows_);
    if (block_non_finite != 0) atomicAdd(&h_->non_finite, block_non_finite);
    Reset();
  }

  // Every thread of the block, after its last Add: adds the block's tally to the counters (its
  // rows first, so that a reader never sees more fired than scored) and its non-finite scores to
  // the running total where the request asks.
  __device__ void End() {
    if (!on_) return;
    Flush();
    __syncthreads();
    const ProbeOutcomeDescriptor& d = h_->d;
    const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
    if (d.counters != nullptr) {
      if (tid == 0 && h_->rows != 0) {
        atomicAdd(d.counters, static_cast<unsigned long long>(h_->rows));
        __threadfence();
      }
      __syncthreads();
      const int cols = h_->cols, buckets = h_->num_bounds + 1;
      const int record = ProbeOutcomeLayout::kBuckets + buckets;
      const double* sum = Sums();
      const uint32_t* fired = reinterpret_cast<const uint32_t*>(sum + cols);
      const uint32_t* non_finite = fired + cols;
      const uint32_t* histogram = non_finite + cols;
      for (int i = tid; i < cols * record; i += threads) {
        const int c = i / record, field = i % record;
        unsigned long long* word =
            d.counters + 1 + static_cast<int64_t>(ProbeOf(c)) * record + field;
        if (field == ProbeOutcomeLayout::kSum) {
          if (sum[c] != 0.0) atomicAdd(reinterpret_cast<double*>(word), sum[c]);
          continue;
        }
        const uint32_t n =
            field == ProbeOutcomeLayout::kFired       ? fired[c]
            : field == ProbeOutcomeLayout::kNonFinite ? non_finite[c]
                                                      : histogram[c * buckets + field -
                                                                  ProbeOutcomeLayout::kBuckets];
        if (n != 0) atomicAdd(word, static_cast<unsigned long long>(n));
      }
    }
    if (tid == 0 && h_->non_finite != 0 && d.add_to_total != 0) {
      atomicAdd(h_->non_finite_total, static_cast<unsigned long long>(h_->non_finite));
    }
  }

 private:
  __device__ double* Sums() const { return reinterpret_cast<double*>(h_ + 1); }
  __device__ uint32_t* Histogram() const {
    return reinterpret_cast<uint32_t*>(Sums() + h_->cols) + 2 * h_->cols;
  }
  __device__ const float* Bounds() const {
    return reinterpret_cast<const float*>(Histogram() + h_->cols * (h_->num_bounds + 1));
  }
  // The tally's column of a probe of this block, and back.
  __device__ __forceinline__ int Column(int probe) const {
    const int c = probe - h_->col_begin;
    return c >= 0 ? c : c + h_->num_probes;
  }
  __device__ __forceinline__ int ProbeOf(int c) const {
    const int probe = h_->col_begin + c;
    return probe < h_->num_probes ? probe : probe - h_->num_probes;
  }
  __device__ __forceinline__ void Reset() {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      sum_[s] = 0.0f;
      fired_[s] = 0;
      non_finite_[s] = 0;
      probe_[s] = -1;
    }
    rows_ = 0;
  }

  OutcomeTallyHeader* h_;
  bool on_;
  // This thread's part since the last Flush, per slot: float sums (a few scores each; the block's
  // are added up in double).
  float sum_[kSlots];
  uint32_t fired_[kSlots];
  uint32_t non_finite_[kSlots];
  int probe_[kSlots];
  uint32_t rows_ = 0;
};

}  // namespace probesidecar::kernels
