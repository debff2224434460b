// The host count of probe outcomes against counts worked out by hand, the layout, Add.
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/probe_outcomes/probe_outcomes.h"

namespace probesidecar::kernels {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

ProbeOutcomeCounts Snapshot(const std::vector<std::atomic<uint64_t>>& slot, ProbeOutcomeLayout l) {
  ProbeOutcomeCounts counts(l, 1);
  for (size_t i = 0; i < slot.size(); ++i) counts.words[i] = slot[i].load();
  return counts;
}

TEST(ProbeOutcomeLayout, WordsAndOffsets) {
  const ProbeOutcomeLayout l{3, 4};
  EXPECT_EQ(l.ProbeWords(), 3 + 5);
  EXPECT_EQ(l.SlotWords(), 1 + 3 * 8);
  EXPECT_EQ(l.ProbeOffset(0), 1);
  EXPECT_EQ(l.ProbeOffset(2), 17);
  EXPECT_TRUE(l.Valid());
  EXPECT_FALSE((ProbeOutcomeLayout{0, 4}).Valid());
  EXPECT_FALSE((ProbeOutcomeLayout{1, kMaxScoreBounds + 1}).Valid());
  EXPECT_TRUE((ProbeOutcomeLayout{1, 0}).Valid());
}

TEST(ScoreBucket, LeSemantics) {
  const float bounds[] = {0.25f, 0.5f, 0.75f};
  EXPECT_EQ(ScoreBucket(bounds, 3, -5.0f), 0);
  EXPECT_EQ(ScoreBucket(bounds, 3, 0.25f), 0);  // on a bound: that bucket (le)
  EXPECT_EQ(ScoreBucket(bounds, 3, 0.2500001f), 1);
  EXPECT_EQ(ScoreBucket(bounds, 3, 0.75f), 2);
  EXPECT_EQ(ScoreBucket(bounds, 3, 0.76f), 3);  // above every bound
  EXPECT_EQ(ScoreBucket(bounds, 0, 1.0f), 0);   // no bounds: one bucket
}

// Two probes over five rows, strided; probe 0 has threshold 0.5, probe 1 none.
TEST(CountProbeOutcomesCpu, CountsFiredNonFiniteBucketsSumAndRows) {
  const float scores[] = {
      0.1f,  0.9f,  99.0f,  // row 0 (column 2 is padding)
      0.5f,  kNaN,  99.0f,  // row 1: exactly the threshold fires
      0.7f,  0.2f,  99.0f,  //
      kInf,  -kInf, 99.0f,  // non-finite: neither fires nor enters a bucket
      0.49f, 1.5f,  99.0f,
  };
  const float thresholds[] = {0.5f, kNaN};
  const float bounds[] = {0.25f, 0.5f, 1.0f};
  const ProbeOutcomeLayout l{2, 3};
  std::vector<std::atomic<uint64_t>> slot(static_cast<size_t>(l.SlotWords()));
  ProbeOutcomeCpuParams params{scores, 3, thresholds, bounds, l};
  // Two tasks of one request.
  CountProbeOutcomesCpu(params, 0, 2, slot.data());
  CountProbeOutcomesCpu(params, 2, 5, slot.data());
  CountProbeOutcomesCpu(params, 4, 4, slot.data());  // empty: nothing
  const ProbeOutcomeCounts c = Snapshot(slot, l);
  EXPECT_EQ(c.rows(0), 5u);
  EXPECT_EQ(c.fired(0, 0), 2u);  // 0.5 and 0.7
  EXPECT_EQ(c.fired(0, 1), 0u);  // no threshold
  EXPECT_EQ(c.non_finite(0, 0), 1u);
  EXPECT_EQ(c.non_finite(0, 1), 2u);
  // Probe 0: 0.1 -> b0, 0.5 -> b1, 0.7 -> b2, 0.49 -> b1.
  EXPECT_EQ(c.bucket(0, 0, 0), 1u);
  EXPECT_EQ(c.bucket(0, 0, 1), 2u);
  EXPECT_EQ(c.bucket(0, 0, 2), 1u);
  EXPECT_EQ(c.bucket(0, 0, 3), 0u);
  // Probe 1: 0.9 -> b2, 0.2 -> b0, 1.5 -> b3 (above every bound).
  EXPECT_EQ(c.bucket(0, 1, 0), 1u);
  EXPECT_EQ(c.bucket(0, 1, 1), 0u);
  EXPECT_EQ(c.bucket(0, 1, 2), 1u);
  EXPECT_EQ(c.bucket(0, 1, 3), 1u);
  EXPECT_NEAR(c.sum(0, 0), 0.1 + 0.5 + 0.7 + 0.49, 1e-6);
  EXPECT_NEAR(c.sum(0, 1), 0.9 + 0.2 + 1.5, 1e-6);
  EXPECT_TRUE(c.Any(0));
  EXPECT_FALSE(c.Any(1));
}

TEST(ProbeOutcomeCounts, AddSumsWordsAndGrowsToTheOthersSlots) {
  const ProbeOutcomeLayout l{1, 1};  // words: rows, sum, fired, non-finite, b0, b1
  ProbeOutcomeCounts a(l, 1), b(l, 2);
  a.words = {3, std::bit_cast<uint64_t>(1.5), 1, 0, 2, 1};
  b.words = {2, std::bit_cast<uint64_t>(0.25), 0, 1, 1, 0, /* slot 1 */ 7, 0, 7, 0, 0, 7};
  a.Add(b);
  ASSERT_EQ(a.slots, 2);
  EXPECT_EQ(a.rows(0), 5u);
  EXPECT_EQ(a.fired(0, 0), 1u);
  EXPECT_EQ(a.non_finite(0, 0), 1u);
  EXPECT_EQ(a.bucket(0, 0, 0), 3u);
  EXPECT_EQ(a.bucket(0, 0, 1), 1u);
  EXPECT_DOUBLE_EQ(a.sum(0, 0), 1.75);
  EXPECT_EQ(a.rows(1), 7u);
  EXPECT_EQ(a.fired(1, 0), 7u);
  ProbeOutcomeCounts empty;
  empty.Add(a);  // an empty count takes the other's layout
  EXPECT_EQ(empty.words, a.words);
}

}  // namespace
}  // namespace probesidecar::kernels
