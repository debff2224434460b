#include "server/executors/cuda/lru_cache.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace probesidecar::server {
namespace {

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
