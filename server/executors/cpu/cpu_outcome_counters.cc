#include "server/executors/cpu/cpu_outcome_counters.h"

#include <algorithm>

namespace probesidecar::server {

CpuOutcomeCounters::CpuOutcomeCounters(const ProbeSet& set, int slots)
    : layout_{set.num_probes, static_cast<int32_t>(set.score_bounds.size())},
      thresholds_(ThresholdsOrNaN(set)),
      bounds_(set.score_bounds),
      slots_(static_cast<size_t>(std::max(slots, 1))) {}

std::atomic<uint64_t>* CpuOutcomeCounters::Slot(int slot) {
  std::atomic<std::atomic<uint64_t>*>& entry = slots_[slot];
  if (std::atomic<uint64_t>* words = entry.load(std::memory_order_acquire)) return words;
  absl::MutexLock lock(&mu_);
  if (std::atomic<uint64_t>* words = entry.load(std::memory_order_acquire)) return words;
  const size_t n = static_cast<size_t>(layout_.SlotWords());
  auto words = std::make_unique<std::atomic<uint64_t>[]>(n);
  for (size_t i = 0; i < n; ++i) words[i].store(0, std::memory_order_relaxed);
  entry.store(words.get(), std::memory_order_release);
  owned_.push_back(std::move(words));
  return owned_.back().get();
}

void CpuOutcomeCounters::Count(const float* scores, int32_t row_begin, int32_t row_end, int slot) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) return;
  kernels::ProbeOutcomeCpuParams params;
  params.scores = scores;
  params.row_stride = layout_.num_probes;
  params.thresholds = thresholds_.data();
  params.bounds = bounds_.data();
  params.layout = layout_;
  kernels::CountProbeOutcomesCpu(params, row_begin, row_end, Slot(slot));
}

kernels::ProbeOutcomeCounts CpuOutcomeCounters::Read() const {
  int used = 0;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].load(std::memory_order_acquire) != nullptr) used = static_cast<int>(s) + 1;
  }
  kernels::ProbeOutcomeCounts counts(layout_, used);
  const int64_t n = layout_.SlotWords();
  for (int s = 0; s < used; ++s) {
    const std::atomic<uint64_t>* words = slots_[s].load(std::memory_order_acquire);
    if (words == nullptr) continue;
    for (int64_t i = 0; i < n; ++i) {
      counts.words[s * n + i] = words[i].load(std::memory_order_relaxed);
    }
  }
  return counts;
}

}  // namespace probesidecar::server
