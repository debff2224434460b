// The graph cache's bookkeeping, without a GPU (entries hold no real graph): a hit runs no
// capture (and with it no dispatch: the kernel path is the entry's, chosen at capture), a miss
// captures once, a failed capture caches nothing, graphs of a set that is gone are dropped.
#include "server/executors/cuda/graph_cache.h"

#include <memory>

#include "gtest/gtest.h"

namespace probesidecar::server {
namespace {

GraphKey Key(uint64_t set_id, int32_t bucket) {
  return GraphKey{set_id, common::DType::kBFloat16, bucket, false, RowSource::kParams, false};
}

TEST(GraphCacheTest, AHitRunsNoCaptureAndKeepsThePathChosenAtCapture) {
  GraphCache cache(8);
  auto set = std::make_shared<ProbeSet>();
  set->id = 7;
  int captures = 0;
  auto capture = [&]() -> absl::StatusOr<GraphEntry> {
    ++captures;
    GraphEntry entry;
    entry.path = kernels::ProbeScorePath::kFusedTensorCore;
    return entry;
  };
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<GraphEntry*> entry = cache.FindOrCapture(Key(7, 64), set, capture);
    ASSERT_TRUE(entry.ok()) << entry.status();
    EXPECT_EQ((*entry)->path, kernels::ProbeScorePath::kFusedTensorCore);
  }
  EXPECT_EQ(captures, 1);
  const GraphCacheCounters c = cache.counters();
  EXPECT_EQ(c.captures, 1u);
  EXPECT_EQ(c.hits, 4u);
  EXPECT_EQ(c.misses, 1u);
  EXPECT_EQ(c.entries, 1u);
  EXPECT_EQ(c.capacity, 8u);
}

TEST(GraphCacheTest, AFailedCaptureCachesNothing) {
  GraphCache cache(8);
  auto set = std::make_shared<ProbeSet>();
  auto fail = []() -> absl::StatusOr<GraphEntry> { return absl::InternalError("capture failed"); };
  EXPECT_EQ(cache.FindOrCapture(Key(1, 8), set, fail).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(cache.counters().entries, 0u);
  EXPECT_EQ(cache.counters().captures, 0u);
}

TEST(GraphCacheTest, GraphsOfASetThatIsGoneAreDroppedAtTheNextCapture) {
  GraphCache cache(8);
  auto capture = []() -> absl::StatusOr<GraphEntry> { return GraphEntry{}; };
  auto gone = std::make_shared<ProbeSet>();
  ASSERT_TRUE(cache.FindOrCapture(Key(1, 8), gone, capture).ok());
  ASSERT_TRUE(cache.FindOrCapture(Key(1, 16), gone, capture).ok());
  EXPECT_EQ(cache.counters().entries, 2u);
  gone.reset();  // unloaded, and no request holds it
  auto kept = std::make_shared<ProbeSet>();
  ASSERT_TRUE(cache.FindOrCapture(Key(2, 8), kept, capture).ok());
  EXPECT_EQ(cache.counters().entries, 1u);
  cache.Clear();
  EXPECT_EQ(cache.counters().entries, 0u);
}

}  // namespace
}  // namespace probesidecar::server
