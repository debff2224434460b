// The recording engine under the service's metrics (metrics.h is the catalogue: which families
// exist, their names, help and labels). Values are striped over per-thread shards of relaxed
// atomics, so that threads recording at once share no lock and no cache line, and summed when
// scraped; labelled series are found without a lock, through a table that only ever grows.
#pragma once

#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/client_metric.h"

namespace probesidecar::server {

// Shards per metric. Each thread records into one shard, the one with the fewest live threads
// when it first records, so up to kShards threads record at once without sharing a cache line; a
// scrape sums the shards. More threads than shards share shards: still correct (atomics), only
// slower.
inline constexpr int kShards = 16;
// Shards are aligned and padded to 128 bytes, not 64: x86's adjacent-line prefetcher pairs 64-byte
// lines, so two threads writing neighbouring lines would still slow each other down.
inline constexpr size_t kShardAlign = 128;

// The calling thread's shard in [0, kShards), shared by every metric (chosen when the thread first
// records, given back when it exits).
int ThreadShard();

// A histogram of durations with the fixed bucket bounds `kBounds` (seconds, ascending), sharded
// per thread. Observe costs a branchless binary search and two uncontended relaxed atomic adds.
// The count is the sum of the buckets, so a scrape always sees cumulative buckets whose +Inf
// equals the count (the sum may be a few observations ahead or behind while requests record).
template <const auto& kBounds>
class DurationHistogram {
 public:
  static constexpr int kNumBuckets = static_cast<int>(kBounds.size()) + 1;  // + the +Inf one

  // `shard` is ThreadShard() (the caller looks it up once for several observations).
  void Observe(double seconds, int shard) {
    // NaN and negatives count as 0; the clamp keeps the nanosecond sum in range.
    seconds = seconds > 0 ? std::min(seconds, 1e9) : 0.0;
    Shard& s = shards_[shard];
    s.buckets[BucketIndex(seconds)].fetch_add(1, std::memory_order_relaxed);
    s.sum_ns.fetch_add(static_cast<uint64_t>(std::llround(seconds * 1e9)),
                       std::memory_order_relaxed);
  }

  // The first bucket whose bound is >= seconds (Prometheus' le), kNumBuckets - 1 for +Inf. A
  // branchless binary search (conditional moves): request durations are unpredictable, and
  // mispredicted branches would cost more than the rest of an observation.
  static int BucketIndex(double seconds) {
    const double* base = kBounds.data();
    size_t n = kBounds.size();
    while (n > 1) {
      const size_t half = n / 2;
      base = base[half - 1] < seconds ? base + half : base;
      n -= half;
    }
    return static_cast<int>(base - kBounds.data()) + (*base < seconds ? 1 : 0);
  }

  prometheus::ClientMetric::Histogram Snapshot() const {
    std::array<uint64_t, kNumBuckets> counts{};
    uint64_t sum_ns = 0;
    for (const Shard& shard : shards_) {
      for (int b = 0; b < kNumBuckets; ++b) {
        counts[b] += shard.buckets[b].load(std::memory_order_relaxed);
      }
      sum_ns += shard.sum_ns.load(std::memory_order_relaxed);
    }
    prometheus::ClientMetric::Histogram h;
    h.bucket.resize(kNumBuckets);
    uint64_t cumulative = 0;
    for (int b = 0; b < kNumBuckets; ++b) {
      cumulative += counts[b];
      h.bucket[b].cumulative_count = cumulative;
      h.bucket[b].upper_bound =
          b + 1 < kNumBuckets ? kBounds[b] : std::numeric_limits<double>::infinity();
    }
    h.sample_count = cumulative;
    h.sample_sum = static_cast<double>(sum_ns) * 1e-9;
    return h;
  }

 private:
  struct alignas(kShardAlign) Shard {
    std::array<std::atomic<uint64_t>, kNumBuckets> buckets{};
    std::atomic<uint64_t> sum_ns{0};
  };
  std::array<Shard, kShards> shards_;
};

// Series by a pair of label values (a, b) -> Group, for recording paths that must not lock. An
// open-addressing table of kSlots whose slots are written once (under a mutex) and never cleared,
// so a reader either finds a published group or an empty slot, and on an empty slot takes the
// lock and looks again. Past `max_groups` distinct pairs, a new pair's first value is folded into
// `other` (its second value is one of a few constants, e.g. a kernel path); past half the table,
// everything goes to one overflow group. Group needs Group(std::string a, std::string b, size_t
// hash) and bool Is(string_view a, string_view b, size_t hash).
template <typename Group, size_t kSlots = 1024>
class SeriesTable {
 public:
  static constexpr size_t kMaxGroups = kSlots / 2;  // at most half full
  static_assert((kSlots & (kSlots - 1)) == 0, "a power of two");

  SeriesTable(size_t max_groups, const char* other)
      : max_groups_(max_groups),
        other_(other),
        unlabelled_(std::make_unique<Group>("", "", 0)),
        overflow_(std::make_unique<Group>(other, other, 0)) {}

  Group& Get(absl::string_view a, absl::string_view b) {
    if (a.empty() && b.empty()) return *unlabelled_;
    size_t hash = Hash(a, b);
    if (Group* group = Find(a, b, hash)) return *group;
    absl::MutexLock lock(&mu_);
    if (Group* group = Find(a, b, hash)) return *group;
    if (groups_.size() >= max_groups_) {
      a = other_;
      hash = Hash(a, b);
      if (Group* group = Find(a, b, hash)) return *group;
      if (groups_.size() >= kMaxGroups) return *overflow_;
    }
    auto group = std::make_unique<Group>(std::string(a), std::string(b), hash);
    for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      if (slots_[i].load(std::memory_order_relaxed) == nullptr) {
        slots_[i].store(group.get(), std::memory_order_release);
        break;
      }
    }
    groups_.push_back(std::move(group));
    return *groups_.back();
  }

  // Every group, in the order they appeared (the unlabelled one first, the overflow last).
  std::vector<const Group*> All() const {
    std::vector<const Group*> all = {unlabelled_.get()};
    {
      absl::MutexLock lock(&mu_);
      for (const auto& group : groups_) all.push_back(group.get());
    }
    all.push_back(overflow_.get());
    return all;
  }

 private:
  static size_t Hash(absl::string_view a, absl::string_view b) {
    return absl::Hash<std::pair<absl::string_view, absl::string_view>>()(std::make_pair(a, b));
  }

  Group* Find(absl::string_view a, absl::string_view b, size_t hash) const {
    for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      Group* group = slots_[i].load(std::memory_order_acquire);
      if (group == nullptr) return nullptr;
      if (group->Is(a, b, hash)) return group;
    }
  }

  const size_t max_groups_;
  const char* const other_;
  const std::unique_ptr<Group> unlabelled_;
  const std::unique_ptr<Group> overflow_;
  std::array<std::atomic<Group*>, kSlots> slots_{};
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace probesidecar::server
