// Probe outcomes as the API and the metrics show them: every slot together and per set of labels
// (ListProbeSets), one series group per slot that scored, probes named up to the cap and one
// "_all" series past it (metrics), bounds printed as they were written.
#include "server/rpc/outcome_report.h"

#include <gtest/gtest.h>

#include <bit>
#include <string>
#include <vector>

namespace probesidecar::server {
namespace {

ProbeSet TwoProbes() {
  ProbeSet set;
  set.name = "s";
  set.num_probes = 2;
  set.probes = {{"a", 0.5f}, {"b", std::nullopt}};
  set.score_bounds = {0.05f, 0.5f};
  return set;
}

// Slot 0: 4 rows; slot 2: 6 rows; slot 1 (the "_other" slot) nothing.
kernels::ProbeOutcomeCounts Counts() {
  kernels::ProbeOutcomeCounts c(kernels::ProbeOutcomeLayout{2, 2}, 3);
  const int64_t n = c.layout.SlotWords();
  auto set = [&](int slot, int probe, int field, uint64_t value) {
    c.words[slot * n + c.layout.ProbeOffset(probe) + field] = value;
  };
  c.words[0] = 4;
  set(0, 0, kernels::ProbeOutcomeLayout::kFired, 1);
  set(0, 0, kernels::ProbeOutcomeLayout::kBuckets + 2, 4);
  set(0, 0, kernels::ProbeOutcomeLayout::kSum, std::bit_cast<uint64_t>(2.5));
  set(0, 1, kernels::ProbeOutcomeLayout::kNonFinite, 4);
  c.words[2 * n] = 6;
  set(2, 0, kernels::ProbeOutcomeLayout::kFired, 5);
  set(2, 0, kernels::ProbeOutcomeLayout::kBuckets + 0, 6);
  set(2, 1, kernels::ProbeOutcomeLayout::kBuckets + 1, 6);
  return c;
}

TEST(OutcomeReport, FillsTotalsAndEachSetOfLabels) {
  OutcomeLabels labels({"model"}, 4);
  bool folded = false;
  ASSERT_EQ(*labels.SlotFor({{"model", "m"}}, &folded), 2);
  const ProbeSet set = TwoProbes();
  v1::ProbeSetInfo info;
  FillProbeOutcomes(set, Counts(), labels, &info);
  const v1::ProbeOutcomes& total = info.outcomes();
  EXPECT_EQ(total.rows_scored(), 10u);
  ASSERT_EQ(total.fired_size(), 2);
  EXPECT_EQ(total.fired(0), 6u);
  ASSERT_EQ(total.bucket_counts_size(), 2 * 3);  // [P, B + 1]
  EXPECT_EQ(total.bucket_counts(0), 6u);
  EXPECT_EQ(total.bucket_counts(2), 4u);
  EXPECT_EQ(total.bucket_counts(4), 6u);  // probe 1, bucket 1
  EXPECT_EQ(total.score_sum(0), 2.5);
  EXPECT_EQ(total.non_finite(1), 4u);
  ASSERT_EQ(info.outcomes_by_labels_size(), 2);  // the slots that scored
  EXPECT_TRUE(info.outcomes_by_labels(0).labels().empty());
  EXPECT_EQ(info.outcomes_by_labels(0).outcomes().rows_scored(), 4u);
  EXPECT_EQ(info.outcomes_by_labels(1).labels().at("model"), "m");
  EXPECT_EQ(info.outcomes_by_labels(1).outcomes().fired(0), 5u);

  // Nothing counted yet: every probe has zero counts and every bucket.
  v1::ProbeSetInfo fresh;
  FillProbeOutcomes(set, kernels::ProbeOutcomeCounts{}, labels, &fresh);
  EXPECT_EQ(fresh.outcomes().fired_size(), 2);
  EXPECT_EQ(fresh.outcomes().non_finite_size(), 2);
  EXPECT_EQ(fresh.outcomes().bucket_counts_size(), 6);
  EXPECT_EQ(fresh.outcomes_by_labels_size(), 0);

  // Not counted: no outcomes at all, even from counts that exist (not zeros that look counted).
  ProbeSet uncounted = TwoProbes();
  uncounted.count_outcomes = false;
  v1::ProbeSetInfo off;
  FillProbeOutcomes(uncounted, Counts(), labels, &off);
  EXPECT_FALSE(off.has_outcomes());
  EXPECT_EQ(off.outcomes_by_labels_size(), 0);
}

TEST(OutcomeReport, SeriesPerProbeUpToTheCapThenOneForTheSet) {
  const ProbeSet set = TwoProbes();
  const std::vector<std::vector<std::string>> values = {{""}, {"_other"}, {"m"}};
  std::vector<ProbeSetOutcomeSeries> named;
  AppendOutcomeSeries(set, Counts(), values, 2, &named);
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[1].label_values, std::vector<std::string>{"m"});
  EXPECT_EQ(named[1].rows, 6u);
  ASSERT_EQ(named[1].probes.size(), 2u);
  EXPECT_EQ(named[1].probes[0].probe, "a");
  EXPECT_EQ(named[1].probes[0].scored, 6u);
  EXPECT_EQ(named[1].probes[0].fired, 5u);
  EXPECT_EQ(named[1].bounds, (std::vector<double>{0.05, 0.5}));

  std::vector<ProbeSetOutcomeSeries> folded;
  AppendOutcomeSeries(set, Counts(), values, 1, &folded);
  ASSERT_EQ(folded.size(), 2u);
  ASSERT_EQ(folded[0].probes.size(), 1u);
  const ProbeOutcomeSeries& all = folded[0].probes[0];
  EXPECT_EQ(all.probe, kAllProbes);
  EXPECT_EQ(all.scored, 8u);  // 4 rows x 2 probes
  EXPECT_EQ(all.fired, 1u);
  EXPECT_EQ(all.non_finite, 4u);
  EXPECT_EQ(all.buckets, (std::vector<uint64_t>{0, 0, 4}));
}

TEST(OutcomeReport, BoundsAsTheDecimalsTheyWereWrittenAs) {
  ProbeSet set;
  set.score_bounds = {0.05f, 0.15f, 1.0f / 3.0f, -7.1f, 1e-7f};
  const std::vector<double> bounds = ScoreBoundsAsDecimals(set);
  EXPECT_EQ(bounds[0], 0.05);
  EXPECT_EQ(bounds[1], 0.15);
  EXPECT_EQ(static_cast<float>(bounds[2]), 1.0f / 3.0f);
  EXPECT_EQ(bounds[3], -7.1);
  EXPECT_EQ(bounds[4], 1e-7);
}

}  // namespace
}  // namespace probesidecar::server
