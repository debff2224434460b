#include "server/executors/cuda/graph_cache.h"

namespace probesidecar::server {

GraphCache::GraphCache(size_t capacity)
    : graphs_(capacity, [this](GraphEntry& entry) {
        // An enqueue-only request may still have this graph queued: let it finish first.
        if (stream_ != nullptr) cudaStreamSynchronize(stream_);
        if (entry.exec != nullptr) cudaGraphExecDestroy(entry.exec);
        if (entry.graph != nullptr) cudaGraphDestroy(entry.graph);
      }) {}

absl::StatusOr<GraphEntry*> GraphCache::FindOrCapture(const GraphKey& key,
                                                      const std::shared_ptr<const ProbeSet>& set,
                                                      Capture capture) {
  GraphEntry* entry = graphs_.Find(key);
  if (entry == nullptr) {
    graphs_.EraseIf([](const GraphKey&, const GraphEntry& e) { return e.probe_set.expired(); });
    absl::StatusOr<GraphEntry> captured = capture();
    if (!captured.ok()) {
      Publish();
      return captured.status();
    }
    captured->probe_set = set;
    ++captures_;
    entry = &graphs_.Insert(key, *captured);
  }
  Publish();
  return entry;
}

void GraphCache::Clear() {
  graphs_.Clear();
  Publish();
}

GraphCacheCounters GraphCache::counters() const {
  GraphCacheCounters c;
  c.entries = entries_.load(std::memory_order_relaxed);
  c.capacity = graphs_.capacity();
  c.hits = hits_.load(std::memory_order_relaxed);
  c.misses = misses_.load(std::memory_order_relaxed);
  c.captures = captures_.load(std::memory_order_relaxed);
  c.evictions = evictions_.load(std::memory_order_relaxed);
  return c;
}

void GraphCache::Publish() {
  entries_.store(graphs_.size(), std::memory_order_relaxed);
  hits_.store(graphs_.hits(), std::memory_order_relaxed);
  misses_.store(graphs_.misses(), std::memory_order_relaxed);
  evictions_.store(graphs_.evictions(), std::memory_order_relaxed);
}

}  // namespace probesidecar::server
