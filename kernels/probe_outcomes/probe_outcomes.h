// What a probe set's probes found: per probe, the scores computed, the scores that fired (at or
// above the probe's threshold), the scores that were NaN or infinite, and a histogram of the finite
// scores over fixed bucket bounds; per set, the rows scored. Counted on the GPU by one small kernel
// that the server's graph runs after the scoring kernels (whatever path scored), into 64-bit device
// counters, one block of them per (probe set, label slot); counted on the host by the CPU backend
// with the same semantics. The counters are read by copying them whole (the metrics scrape),
// never per request.
//
// Semantics (both implementations): a score is non-finite when it is NaN or infinite; it then
// neither fires nor enters the histogram. A finite score fires when the probe has a threshold and
// score >= threshold. Bucket b (0 <= b <= B, B bounds ascending) holds the finite scores s with
// bounds[b - 1] < s <= bounds[b] (Prometheus' `le`), the last one those above every bound.
//
// Plain C++ (the CUDA runtime header only, for cudaError_t): the CPU backend and the CPU tests use
// the host half without device code.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "kernels/probe_outcomes/probe_outcomes_limits.h"

namespace probesidecar::kernels {

// The counters of one (probe set, label slot): word 0 is the rows scored; then one record of
// ProbeWords() words per probe, at ProbeOffset(p): [kSum] the sum of its finite scores (the bits of
// a double), [kFired], [kNonFinite], [kBuckets + b] the finite scores of bucket b, b in [0, B].
struct ProbeOutcomeLayout {
  static constexpr int kSum = 0;
  static constexpr int kFired = 1;
  static constexpr int kNonFinite = 2;
  static constexpr int kBuckets = 3;

  int32_t num_probes = 0;  // P
  int32_t num_bounds = 0;  // B, at most kMaxScoreBounds

  int64_t ProbeWords() const { return kBuckets + num_bounds + 1; }
  int64_t SlotWords() const { return 1 + int64_t{num_probes} * ProbeWords(); }
  int64_t ProbeOffset(int32_t probe) const { return 1 + int64_t{probe} * ProbeWords(); }
  bool Valid() const { return num_probes > 0 && num_bounds >= 0 && num_bounds <= kMaxScoreBounds; }
};

// A copy of the counters of a set's label slots, [slots, SlotWords()] (what the scrape reads);
// slots never written read as zero.
struct ProbeOutcomeCounts {
  ProbeOutcomeLayout layout;
  int32_t slots = 0;
  std::vector<uint64_t> words;

  ProbeOutcomeCounts() = default;
  ProbeOutcomeCounts(ProbeOutcomeLayout layout, int32_t slots);

  uint64_t rows(int32_t slot) const { return words[slot * layout.SlotWords()]; }
  uint64_t fired(int32_t slot, int32_t probe) const {
    return Word(slot, probe, ProbeOutcomeLayout::kFired);
  }
  uint64_t non_finite(int32_t slot, int32_t probe) const {
    return Word(slot, probe, ProbeOutcomeLayout::kNonFinite);
  }
  uint64_t bucket(int32_t slot, int32_t probe, int32_t b) const {
    return Word(slot, probe, ProbeOutcomeLayout::kBuckets + b);
  }
  double sum(int32_t slot, int32_t probe) const;
  // Whether slot `slot` counted anything.
  bool Any(int32_t slot) const { return slot < slots && rows(slot) != 0; }

  // Adds `other` (the same layout) in: another device's counts. Grows to its slots.
  void Add(const ProbeOutcomeCounts& other);

 private:
  uint64_t Word(int32_t slot, int32_t probe, int field) const {
    return words[slot * layout.SlotWords() + layout.ProbeOffset(probe) + field];
  }
};

// ---- The host implementation (the CPU backend) --------------------------------------------

struct ProbeOutcomeCpuParams {
  const float* scores = nullptr;      // [R, row_stride] float32
  int64_t row_stride = 0;             // elements, >= P
  const float* thresholds = nullptr;  // [P]; NaN: the probe has none (never fires)
  const float* bounds = nullptr;      // [B] ascending, finite
  ProbeOutcomeLayout layout;
};

// Counts rows [row_begin, row_end) of the scores into `slot` ([SlotWords()] words; the sum words
// hold doubles' bits), adding with relaxed atomics: tasks of one request, and requests on other
// threads, count into the same slot at once.
void CountProbeOutcomesCpu(const ProbeOutcomeCpuParams& params, int32_t row_begin, int32_t row_end,
                           std::atomic<uint64_t>* slot);

// The bucket of a finite score: the first b with score <= bounds[b], else B.
int32_t ScoreBucket(const float* bounds, int32_t num_bounds, float score);

// ---- The device implementation ------------------------------------------------------------

// What the count reads per request, in device memory (written by whatever precedes it in the
// graph: the server's staging kernel), so that one captured graph serves every request.
struct ProbeOutcomeDescriptor {
  const float* scores = nullptr;  // [R, scores_row_stride] float32, as the scoring kernels wrote
  int64_t scores_row_stride = 0;  // elements
  // [R, copy_row_stride] float32 or nullptr: where the scores are also copied (the response's
  // mapped host memory: the scoring kernels write to device memory, and this copy is the only
  // pass over the bus).
  float* copy_to = nullptr;
  int64_t copy_row_stride = 0;  // elements
  // [SlotWords()] the counters of the request's label slot of its set, or nullptr: count nothing.
  unsigned long long* counters = nullptr;
  // [R / group_rows] or nullptr (every row counts): of each group of group_rows consecutive rows,
  // only the first group_counts[g] (clamped to [0, group_rows]) are counted, outcomes and
  // non-finite scores alike (the others are padding); all are still copied.
  const int32_t* group_counts = nullptr;
  int32_t num_rows = 0;  // R
  // Nonzero: the request's non-finite scores are also added to *non_finite_total (the running
  // total of device outputs; scores returned in responses are counted by the host that reads them).
  int32_t add_to_total = 0;
  int32_t group_rows = 1;  // > 0
  // Nonzero: the request's non-finite count is written to *request_non_finite (a synchronous
  // request with a device output answers with it). It takes the blocks a ticket to add up, so
  // only requests that need it ask.
  int32_t publish_count = 0;
};

// Grid: (row groups, probe tiles of 128 probes), threads: a multiple of the tile's width (each
// thread one probe column, several rows), at most 256 (128 for 4 probes or fewer); a histogram
// per probe of the tile in shared memory, added to the counters once per block (a request of at
// most 64 rows: each score added to the counters directly); where asked, the request's
// non-finite count is published (by the last block to finish).
struct CountProbeOutcomesParams {
  const ProbeOutcomeDescriptor* descriptor = nullptr;  // [1] device
  const float* thresholds = nullptr;                   // [P] device; NaN: none
  const float* bounds = nullptr;                       // [B] device
  int32_t num_probes = 0;                              // P
  int32_t num_bounds = 0;                              // B <= kMaxScoreBounds
  int32_t bucket = 0;                                  // launch shape: rows at most (R <= bucket)
  // [2] device scratch of publish_count: non-finite count so far and blocks done; zero before the
  // first launch and left zero by every launch (the last block resets it).
  uint32_t* scratch = nullptr;
  // [1] device: the running total of NaN or infinite scores of requests with add_to_total (read by
  // copying it, like the counters).
  unsigned long long* non_finite_total = nullptr;
  // [1] this request's NaN or infinite scores, when publish_count (host-mapped memory is fine: one
  // plain store).
  uint32_t* request_non_finite = nullptr;
};

// How the count follows the kernel before it on the stream.
enum class OutcomeLaunch {
  kStreamOrder,  // once that kernel has finished
  // As its programmatic dependent: its blocks are scheduled and set up while that kernel's last
  // blocks finish, and wait on the GPU (griddepcontrol.wait) before reading the scores; plain
  // stream order where the count's code cannot wait (CountCanFollowProgrammatically).
  kProgrammatic,
};

// Whether kProgrammatic launches are programmatic on the current device (the count's code holds
// the grid-dependency wait: compiled for sm_90 or later). Ask once outside any stream capture
// (e.g. when a stream slot is made): the answer is cached.
bool CountCanFollowProgrammatically();

// Scores (rows x probes of a launch shape) up to which following programmatically pays: above it
// the count's blocks, launched during the scoring kernel's last wave, slowed a long scoring
// kernel more than their early launch saved (H200, bench/results/outcomes.md: R = 8192, P = 1024
// took +100 µs programmatically, +70 µs in stream order; up to 1M scores programmatic was
// 0-1.5 µs faster).
inline constexpr int64_t kProgrammaticCountMaxScores = int64_t{1} << 21;

// Enqueues the count on `stream` (or captures it). cudaErrorInvalidValue for params out of range.
cudaError_t LaunchCountProbeOutcomes(const CountProbeOutcomesParams& params, cudaStream_t stream,
                                     OutcomeLaunch launch = OutcomeLaunch::kStreamOrder);

// A set's thresholds and bounds on the device, laid out once when it is loaded.
struct ProbeOutcomeTables {
  const float* thresholds = nullptr;  // [P]
  const float* bounds = nullptr;      // [B] (nullptr when B = 0)
  void* storage = nullptr;
};
// Allocates and uploads (synchronously: load time only). `thresholds` [P] (NaN: none), `bounds`
// [B].
cudaError_t CreateProbeOutcomeTables(const float* thresholds, const float* bounds,
                                     ProbeOutcomeLayout layout, ProbeOutcomeTables* out);
cudaError_t DestroyProbeOutcomeTables(ProbeOutcomeTables* tables);

// One label slot's counters, [SlotWords()] words, zeroed on `stream` (the caller waits for the
// stream before other streams use them).
cudaError_t CreateProbeOutcomeCounters(ProbeOutcomeLayout layout, cudaStream_t stream,
                                       unsigned long long** out);

}  // namespace probesidecar::kernels
