// The host half of probe outcomes: the counts' accessors and the CPU backend's counting.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "kernels/probe_outcomes/probe_outcomes.h"

namespace probesidecar::kernels {
namespace {

// Adds a double into a word that holds a double's bits.
void AddDouble(std::atomic<uint64_t>& word, double value) {
  uint64_t seen = word.load(std::memory_order_relaxed);
  while (!word.compare_exchange_weak(seen,
                                     std::bit_cast<uint64_t>(std::bit_cast<double>(seen) + value),
                                     std::memory_order_relaxed)) {
  }
}

}  // namespace

ProbeOutcomeCounts::ProbeOutcomeCounts(ProbeOutcomeLayout layout, int32_t slots)
    : layout(layout), slots(slots), words(static_cast<size_t>(slots * layout.SlotWords()), 0) {}

double ProbeOutcomeCounts::sum(int32_t slot, int32_t probe) const {
  return std::bit_cast<double>(Word(slot, probe, ProbeOutcomeLayout::kSum));
}

void ProbeOutcomeCounts::Add(const ProbeOutcomeCounts& other) {
  if (other.slots > slots) {
    if (slots == 0) layout = other.layout;
    words.resize(static_cast<size_t>(other.slots * layout.SlotWords()), 0);
    slots = other.slots;
  }
  const int64_t slot_words = layout.SlotWords();
  for (int32_t s = 0; s < other.slots; ++s) {
    uint64_t* to = words.data() + s * slot_words;
    const uint64_t* from = other.words.data() + s * slot_words;
    to[0] += from[0];
    for (int32_t p = 0; p < layout.num_probes; ++p) {
      const int64_t base = layout.ProbeOffset(p);
      for (int64_t f = 0; f < layout.ProbeWords(); ++f) {
        if (f == ProbeOutcomeLayout::kSum) {
          to[base + f] = std::bit_cast<uint64_t>(std::bit_cast<double>(to[base + f]) +
                                                 std::bit_cast<double>(from[base + f]));
        } else {
          to[base + f] += from[base + f];
        }
      }
    }
  }
}

int32_t ScoreBucket(const float* bounds, int32_t num_bounds, float score) {
  return static_cast<int32_t>(std::lower_bound(bounds, bounds + num_bounds, score) - bounds);
}

void CountProbeOutcomesCpu(const ProbeOutcomeCpuParams& params, int32_t row_begin, int32_t row_end,
                           std::atomic<uint64_t>* slot) {
  if (row_end <= row_begin) return;
  // Rows first, so that a concurrent reader never sees more fired than scored.
  slot[0].fetch_add(static_cast<uint64_t>(row_end - row_begin), std::memory_order_relaxed);
  const ProbeOutcomeLayout& layout = params.layout;
  const int32_t buckets = layout.num_bounds + 1;
  // One probe at a time over the task's rows (a few hundred at most: they are in cache), counted
  // locally and added once.
  std::vector<uint64_t> histogram(static_cast<size_t>(buckets));
  for (int32_t p = 0; p < layout.num_probes; ++p) {
    std::fill(histogram.begin(), histogram.end(), 0);
    uint64_t fired = 0, non_finite = 0;
    double sum = 0;
    const float threshold = params.thresholds[p];
    for (int32_t r = row_begin; r < row_end; ++r) {
      const float score = params.scores[r * params.row_stride + p];
      if (!std::isfinite(score)) {
        ++non_finite;
        continue;
      }
      sum += score;
      fired += score >= threshold ? 1 : 0;  // false for a NaN threshold
      ++histogram[ScoreBucket(params.bounds, layout.num_bounds, score)];
    }
    std::atomic<uint64_t>* record = slot + layout.ProbeOffset(p);
    if (non_finite != 0) {
      record[ProbeOutcomeLayout::kNonFinite].fetch_add(non_finite, std::memory_order_relaxed);
    }
    if (fired != 0) record[ProbeOutcomeLayout::kFired].fetch_add(fired, std::memory_order_relaxed);
    if (sum != 0) AddDouble(record[ProbeOutcomeLayout::kSum], sum);
    for (int32_t b = 0; b < buckets; ++b) {
      if (histogram[b] != 0) {
        record[ProbeOutcomeLayout::kBuckets + b].fetch_add(histogram[b], std::memory_order_relaxed);
      }
    }
  }
}

}  // namespace probesidecar::kernels
