#include "server/observability/sharded_counters.h"

#include <algorithm>

namespace probesidecar::server {
namespace {

// Which shard each live thread records into (gRPC's threads come and go: a round-robin choice
// would soon put two busy threads on one shard).
class ShardAssignment {
 public:
  int Acquire() {
    absl::MutexLock lock(&mu_);
    const int shard =
        static_cast<int>(std::min_element(users_.begin(), users_.end()) - users_.begin());
    ++users_[shard];
    return shard;
  }
  void Release(int shard) {
    absl::MutexLock lock(&mu_);
    --users_[shard];
  }

 private:
  absl::Mutex mu_;
  std::array<int, kShards> users_ ABSL_GUARDED_BY(mu_){};
};

ShardAssignment& Assignment() {
  static ShardAssignment* assignment = new ShardAssignment();  // outlives every thread
  return *assignment;
}

struct ThreadShardHolder {
  ThreadShardHolder() : index(Assignment().Acquire()) {}
  ~ThreadShardHolder() { Assignment().Release(index); }
  const int index;
};

}  // namespace

int ThreadShard() {
  thread_local const ThreadShardHolder holder;
  return holder.index;
}

}  // namespace probesidecar::server
