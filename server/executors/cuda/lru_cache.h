// A bounded least-recently-used map (the CUDA executor keeps its captured graphs in one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <utility>

namespace probesidecar::server {

// A least-recently-used map of at most `capacity` entries; `on_evict` runs on every entry that
// leaves it (eviction, EraseIf, Clear). Not thread-safe.
template <typename Key, typename Value>
class LruCache {
 public:
  LruCache(size_t capacity, std::function<void(Value&)> on_evict)
      : capacity_(capacity), on_evict_(std::move(on_evict)) {}
  ~LruCache() { Clear(); }
  LruCache(const LruCache&) = delete;
  LruCache& operator=(const LruCache&) = delete;

  // The entry (now the most recent), or nullptr.
  Value* Find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }

  // Inserts (replacing an entry of the same key), evicting the least recent past capacity.
  Value& Insert(const Key& key, Value value) {
    if (auto it = index_.find(key); it != index_.end()) Erase(it);
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    while (order_.size() > capacity_) {
      Erase(index_.find(order_.back().first));
      ++evictions_;
    }
    return order_.front().second;
  }

  template <typename Predicate>
  void EraseIf(Predicate predicate) {
    for (auto it = index_.begin(); it != index_.end();) {
      auto next = std::next(it);
      if (predicate(it->first, it->second->second)) Erase(it);
      it = next;
    }
  }

  void Clear() {
    while (!order_.empty()) Erase(index_.find(order_.back().first));
  }

  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t evictions() const { return evictions_; }

 private:
  using Order = std::list<std::pair<Key, Value>>;
  void Erase(typename std::map<Key, typename Order::iterator>::iterator it) {
    on_evict_(it->second->second);
    order_.erase(it->second);
    index_.erase(it);
  }

  const size_t capacity_;
  const std::function<void(Value&)> on_evict_;
  Order order_;
  std::map<Key, typename Order::iterator> index_;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace probesidecar::server
