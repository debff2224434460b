#include "server/graph_cache.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace probesidecar::server {
namespace {

TEST(RowBucketTest, SmallestBucketAtLeastTheRows) {
  EXPECT_EQ(RowBucket(0), 1);
  EXPECT_EQ(RowBucket(1), 1);
  EXPECT_EQ(RowBucket(2), 2);
  EXPECT_EQ(RowBucket(3), 4);
  EXPECT_EQ(RowBucket(64), 64);
  EXPECT_EQ(RowBucket(65), 128);
  EXPECT_EQ(RowBucket(1024), 1024);
  EXPECT_EQ(RowBucket(1025), 2048);
  EXPECT_EQ(RowBucket(8192), 8192);
  EXPECT_EQ(RowBucket(8193), 16384);
  EXPECT_EQ(RowBucket(65536), 65536);
  // Never below the rows, never more than 2x above (1.125x past 8192); few distinct buckets.
  std::vector<int32_t> seen;
  for (int32_t r = 1; r <= 70000; ++r) {
    const int32_t b = RowBucket(r);
    ASSERT_GE(b, r);
    ASSERT_LE(b, r <= 8192 ? 2 * r : r + 8191);
    if (seen.empty() || seen.back() != b) seen.push_back(b);
  }
  EXPECT_LT(seen.size(), 30u);
}

TEST(LruCacheTest, EvictsTheLeastRecentlyUsedAndCountsEverything) {
  std::vector<std::string> evicted;
  LruCache<int, std::string> cache(2, [&](std::string& v) { evicted.push_back(v); });
  cache.Insert(1, "one");
  cache.Insert(2, "two");
  ASSERT_NE(cache.Find(1), nullptr);  // 1 is now the most recent
  cache.Insert(3, "three");           // evicts 2
  EXPECT_EQ(evicted, std::vector<std::string>{"two"});
  EXPECT_EQ(cache.Find(2), nullptr);
  EXPECT_EQ(*cache.Find(3), "three");
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_EQ(cache.misses(), 1u);
  EXPECT_EQ(cache.evictions(), 1u);
  cache.Insert(3, "THREE");  // replacing releases the old value
  EXPECT_EQ(evicted.back(), "three");
  cache.EraseIf([](int key, const std::string&) { return key == 1; });
  EXPECT_EQ(evicted.back(), "one");
  EXPECT_EQ(cache.size(), 1u);
  cache.Clear();
  EXPECT_EQ(evicted.back(), "THREE");
  EXPECT_EQ(cache.size(), 0u);
}

TEST(LruCacheTest, DestructionReleasesEveryEntry) {
  int released = 0;
  {
    LruCache<int, int> cache(10, [&](int&) { ++released; });
    for (int i = 0; i < 5; ++i) cache.Insert(i, i);
  }
  EXPECT_EQ(released, 5);
}

}  // namespace
}  // namespace probesidecar::server
