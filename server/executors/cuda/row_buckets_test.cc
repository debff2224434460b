#include "server/executors/cuda/row_buckets.h"

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

}  // namespace
}  // namespace probesidecar::server
