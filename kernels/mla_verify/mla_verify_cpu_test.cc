// CPU-only tests of MLA verify (run in CI, no GPU): the float64 reference against a direct
// two-pass float64 formula on small shapes (causal edges, lengths below one page and on page
// boundaries, variable lengths, shuffled page tables, strided views, lse), the comparison helper
// catching one planted wrong element, the split plan's arithmetic, and the launch checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/mla_verify/mla_verify.h"
#include "kernels/mla_verify/mla_verify_plan.h"
#include "kernels/mla_verify/mla_verify_ref.h"

namespace probesidecar::kernels {
namespace {

constexpr int kDqk = 576, kDv = 512, kPage = 64;

struct Problem {
  int32_t batch, s_q, h_q;
  std::vector<int32_t> lens;
  int64_t q_head_stride = kDqk;  // > 576 makes q a strided view
  int64_t kv_row_stride = kDqk;
  std::vector<uint16_t> q, kv;
  std::vector<int32_t> table;
  int32_t max_pages = 0;
  MlaVerifyRefInputs in;
};

// Random q and cache (never zeros), pages shuffled; unused rows and pages hold NaN so that a
// reference reading past a sequence would produce NaN.
void Build(Problem* pr, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const uint16_t nan_bits = 0x7fc1;
  pr->max_pages = 0;
  int32_t total_pages = 0;
  for (int32_t len : pr->lens) {
    pr->max_pages = std::max(pr->max_pages, (len + kPage - 1) / kPage);
    total_pages += (len + kPage - 1) / kPage;
  }
  pr->max_pages += 1;
  const int32_t num_pages = total_pages + 3;  // 3 unused pages
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t page_stride = kPage * pr->kv_row_stride;
  pr->kv.assign(static_cast<size_t>(num_pages) * page_stride, nan_bits);
  pr->table.assign(static_cast<size_t>(pr->batch) * pr->max_pages, perm[num_pages - 1]);
  int32_t next = 0;
  for (int32_t b = 0; b < pr->batch; ++b) {
    const int32_t len = pr->lens[b];
    for (int32_t pg = 0; pg * kPage < len; ++pg) {
      const int32_t page = perm[next++];
      pr->table[b * pr->max_pages + pg] = page;
      for (int32_t t = 0; t < kPage && pg * kPage + t < len; ++t) {
        for (int d = 0; d < kDqk; ++d) {
          pr->kv[page * page_stride + t * pr->kv_row_stride + d] = common::FloatToBf16(u(rng));
        }
      }
    }
  }
  const int64_t token_stride = pr->h_q * pr->q_head_stride;
  pr->q.assign(static_cast<size_t>(pr->batch) * pr->s_q * token_stride, nan_bits);
  for (int32_t b = 0; b < pr->batch; ++b)
    for (int32_t j = 0; j < pr->s_q; ++j)
      for (int32_t h = 0; h < pr->h_q; ++h)
        for (int d = 0; d < kDqk; ++d)
          pr->q[(b * pr->s_q + j) * token_stride + h * pr->q_head_stride + d] =
              common::FloatToBf16(u(rng) * 2.0f);
  MlaVerifyRefInputs& in = pr->in;
  in.batch = pr->batch;
  in.s_q = pr->s_q;
  in.h_q = pr->h_q;
  in.softmax_scale = 1.0 / std::sqrt(static_cast<double>(kDqk)) * 1.7;
  in.q = pr->q.data();
  in.q_head_stride = pr->q_head_stride;
  in.q_token_stride = token_stride;
  in.q_batch_stride = pr->s_q * token_stride;
  in.kv_cache = pr->kv.data();
  in.kv_row_stride = pr->kv_row_stride;
  in.kv_page_stride = page_stride;
  in.block_table = pr->table.data();
  in.block_table_batch_stride = pr->max_pages;
  in.cache_seqlens = pr->lens.data();
}

// The direct formula: gather the visible keys into a dense matrix, all scores, max, exp, sum.
void Direct(const Problem& pr, int32_t b, int32_t j, int32_t h, std::vector<double>* out,
            double* lse) {
  const MlaVerifyRefInputs& in = pr.in;
  const int64_t visible = static_cast<int64_t>(pr.lens[b]) - pr.s_q + j + 1;
  out->assign(kDv, 0.0);
  if (visible <= 0) {
    *lse = -std::numeric_limits<double>::infinity();
    return;
  }
  std::vector<std::vector<double>> keys(visible, std::vector<double>(kDqk));
  for (int64_t k = 0; k < visible; ++k) {
    const int32_t page = pr.table[b * pr.max_pages + k / kPage];
    for (int d = 0; d < kDqk; ++d)
      keys[k][d] =
          common::Bf16ToFloat(pr.kv[page * in.kv_page_stride + (k % kPage) * in.kv_row_stride + d]);
  }
  std::vector<double> s(visible);
  const uint16_t* qp = in.q + b * in.q_batch_stride + j * in.q_token_stride + h * in.q_head_stride;
  for (int64_t k = 0; k < visible; ++k) {
    double dot = 0.0;
    for (int d = 0; d < kDqk; ++d) dot += common::Bf16ToFloat(qp[d]) * keys[k][d];
    s[k] = dot * in.softmax_scale;
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0.0;
  for (double& v : s) sum += (v = std::exp(v - mx));
  for (int64_t k = 0; k < visible; ++k)
    for (int d = 0; d < kDv; ++d) (*out)[d] += s[k] / sum * keys[k][d];
  *lse = mx + std::log(sum);
}

void CheckAgainstDirect(Problem* pr, uint64_t seed) {
  Build(pr, seed);
  MlaVerifyRefOutputs ref;
  MlaVerifyReference(pr->in, &ref);
  std::vector<double> direct;
  double worst = 0.0;
  for (int32_t b = 0; b < pr->batch; ++b)
    for (int32_t j = 0; j < pr->s_q; ++j)
      for (int32_t h = 0; h < pr->h_q; ++h) {
        double lse;
        Direct(*pr, b, j, h, &direct, &lse);
        const size_t row = (static_cast<size_t>(b) * pr->s_q + j) * pr->h_q + h;
        const double ref_lse = ref.lse[(static_cast<size_t>(b) * pr->h_q + h) * pr->s_q + j];
        if (std::isinf(lse)) {
          EXPECT_TRUE(std::isinf(ref_lse) && ref_lse < 0) << "b=" << b << " j=" << j;
        } else {
          EXPECT_NEAR(ref_lse, lse, 1e-11 * (1.0 + std::fabs(lse))) << "b=" << b << " j=" << j;
        }
        for (int d = 0; d < kDv; ++d) {
          const double err = std::fabs(ref.out[row * kDv + d] - direct[d]);
          worst = std::max(worst, err);
          ASSERT_LE(err, 1e-12) << "b=" << b << " j=" << j << " h=" << h << " d=" << d;
          ASSERT_FALSE(std::isnan(ref.abs_weighted[row * kDv + d]));
        }
      }
  EXPECT_LE(worst, 1e-12);
}

TEST(MlaVerifyRefTest, SingleTokenShortLengths) {
  Problem pr{.batch = 5, .s_q = 1, .h_q = 16, .lens = {1, 2, 63, 64, 65}};
  CheckAgainstDirect(&pr, 11);
}

TEST(MlaVerifyRefTest, CausalEdgesAndPageBoundaries) {
  // s_q = 4: lengths 4 (the first query sees exactly one key), 64 and 128 (page boundaries),
  // 67 (the draft tokens straddle a page boundary), 200.
  Problem pr{.batch = 5, .s_q = 4, .h_q = 16, .lens = {4, 64, 67, 128, 200}};
  CheckAgainstDirect(&pr, 12);
}

TEST(MlaVerifyRefTest, LengthShorterThanDraftGivesEmptyRows) {
  // L = 2 < s_q = 5: queries 0..2 see no key (out 0, lse -inf); 3 and 4 see 1 and 2 keys.
  Problem pr{.batch = 2, .s_q = 5, .h_q = 16, .lens = {2, 130}};
  CheckAgainstDirect(&pr, 13);
}

TEST(MlaVerifyRefTest, StridedViewsAndMoreHeads) {
  Problem pr{.batch = 3, .s_q = 2, .h_q = 32, .lens = {16, 129, 191}};
  pr.q_head_stride = 640;
  pr.kv_row_stride = 584;
  CheckAgainstDirect(&pr, 14);
}

// ---------------------------------------------------------------------------------------------
// The comparison helper must catch one wrong element among many.

TEST(MlaCompareTest, CatchesOnePlantedWrongElement) {
  Problem pr{.batch = 2, .s_q = 2, .h_q = 16, .lens = {70, 33}};
  Build(&pr, 21);
  MlaVerifyRefOutputs ref;
  MlaVerifyReference(pr.in, &ref);
  const int64_t n = static_cast<int64_t>(ref.out.size());
  // A faithful bf16 result passes.
  std::vector<float> got(n);
  for (int64_t i = 0; i < n; ++i)
    got[i] = common::Bf16ToFloat(common::FloatToBf16(static_cast<float>(ref.out[i])));
  MlaCompareResult ok = CompareMlaOutput(got.data(), ref.out.data(), ref.abs_weighted.data(), n);
  EXPECT_TRUE(ok.ok());
  EXPECT_LT(ok.rel_l2, 4e-3);
  // One element off by 3% of the error scale's worth: caught, and named.
  const int64_t planted = n / 3 + 7;
  std::vector<float> bad = got;
  bad[planted] +=
      static_cast<float>(0.03 * (std::fabs(ref.out[planted]) + ref.abs_weighted[planted]));
  MlaCompareResult r = CompareMlaOutput(bad.data(), ref.out.data(), ref.abs_weighted.data(), n);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.bad, 1);
  EXPECT_EQ(r.worst_index, planted);
  // One NaN (an unwritten, poisoned element): caught.
  bad = got;
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  r = CompareMlaOutput(bad.data(), ref.out.data(), ref.abs_weighted.data(), n);
  EXPECT_EQ(r.bad, 1);
  EXPECT_EQ(r.nan, 1);
  EXPECT_EQ(r.worst_index, 5);
  // LSE: one value off by 0.01, and -inf where a finite value belongs.
  std::vector<float> lse(ref.lse.begin(), ref.lse.end());
  EXPECT_TRUE(CompareMlaLse(lse.data(), ref.lse.data(), lse.size()).ok());
  lse[3] += 0.01f;
  EXPECT_EQ(CompareMlaLse(lse.data(), ref.lse.data(), lse.size()).bad, 1);
  lse[3] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(CompareMlaLse(lse.data(), ref.lse.data(), lse.size()).bad, 1);
}

TEST(MlaCompareTest, CausalOffByOneIsCaught) {
  // A kernel whose causal mask lets each query see one key too many must fail the comparison:
  // emulate it with the reference on lengths L + 1 (same s_q) against the one on L.
  Problem pr{.batch = 2, .s_q = 4, .h_q = 16, .lens = {9, 40}};
  Build(&pr, 22);
  MlaVerifyRefOutputs ref, shifted;
  MlaVerifyReference(pr.in, &ref);
  std::vector<int32_t> longer = pr.lens;
  for (int32_t& l : longer) l += 1;  // key L (random data in the same page) becomes visible
  // Fill the extra key with random values (it is NaN-poisoned now).
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int32_t b = 0; b < pr.batch; ++b) {
    const int32_t page = pr.table[b * pr.max_pages + pr.lens[b] / kPage];
    for (int d = 0; d < kDqk; ++d)
      pr.kv[page * pr.in.kv_page_stride + (pr.lens[b] % kPage) * pr.in.kv_row_stride + d] =
          common::FloatToBf16(u(rng));
  }
  MlaVerifyRefInputs in = pr.in;
  in.cache_seqlens = longer.data();
  in.s_q = pr.s_q;
  MlaVerifyReference(in, &shifted);
  std::vector<float> got(shifted.out.begin(), shifted.out.end());
  const MlaCompareResult r =
      CompareMlaOutput(got.data(), ref.out.data(), ref.abs_weighted.data(), got.size());
  EXPECT_GT(r.bad, 100);
}

// ---------------------------------------------------------------------------------------------
// The split plan: every page of every request covered exactly once, slots within bounds.

TEST(MlaPlanTest, RangesCoverEveryPageOnceAndSlotsFit) {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t batch = 1 + static_cast<int32_t>(rng() % 256);
    const int32_t num_sms = trial % 3 == 0 ? 132 : 1 + static_cast<int32_t>(rng() % 140);
    const int32_t s_q = 1 + static_cast<int32_t>(rng() % 16);
    const int32_t h_q = 16 << (rng() % 4);
    const int32_t rows = s_q * h_q;
    std::vector<int32_t> lens(batch);
    for (int32_t& l : lens) {
      const int kind = static_cast<int>(rng() % 4);
      l = kind == 0   ? static_cast<int32_t>(rng() % 64)
          : kind == 1 ? 64 * (1 + static_cast<int32_t>(rng() % 8))
                      : 1 + static_cast<int32_t>(rng() % (kind == 2 ? 5000 : 131072));
    }
    const int32_t parts =
        trial % 2 ? mla::NumParts(num_sms, rows) : mla::NumPartsSm90a(num_sms, rows);
    std::vector<int32_t> cum(batch + 1, 0);
    for (int32_t b = 0; b < batch; ++b) cum[b + 1] = cum[b] + mla::UnitsOf(lens[b]);
    const int32_t per = mla::UnitsPerPart(cum[batch], parts);
    ASSERT_LE(static_cast<int64_t>(per) * parts, static_cast<int64_t>(cum[batch]) + parts);
    int64_t slots = 0;
    for (int32_t b = 0; b < batch; ++b) {
      const int32_t splits = mla::NumSplits(cum[b], cum[b + 1], per);
      const int32_t first = mla::FirstPart(cum[b], per);
      ASSERT_GE(splits, 1);
      ASSERT_LT(first + splits - 1, parts) << "a request's last range must exist";
      // The ranges [p*per, (p+1)*per) for p in first..first+splits-1 cover [cum[b], cum[b+1]).
      ASSERT_LE(static_cast<int64_t>(first) * per, cum[b]);
      ASSERT_GE(static_cast<int64_t>(first + splits) * per, cum[b + 1]);
      ASSERT_LT(static_cast<int64_t>(first + splits - 1) * per, cum[b + 1]);
      if (splits > 1) slots += splits;
    }
    ASSERT_LE(slots, 2 * static_cast<int64_t>(parts));
    int32_t split_requests = 0;
    for (int32_t b = 0; b < batch; ++b)
      split_requests += mla::NumSplits(cum[b], cum[b + 1], per) > 1;
    ASSERT_LE(split_requests, mla::MaxSplitRequests(batch, parts));
    ASSERT_LE(slots * rows, mla::PartialRowsFor(num_sms))
        << "batch " << batch << " sms " << num_sms << " rows " << rows;
  }
}

// GPU families (kDeviceFamilies): the portable tile each family's blocks hold, per row count.
TEST(MlaPlanTest, EveryFamilyGetsATileThatFitsIt) {
  for (const DeviceFamily& family : kDeviceFamilies) {
    SCOPED_TRACE(family.name);
    const mla::TileDevice d = mla::TileDeviceFrom(family.limits);
    for (int32_t rows = 1; rows <= kMlaMaxSq * kMlaMaxHeads; ++rows) {
      const mla::TileChoice t = mla::ChooseTile(rows, d);
      ASSERT_GE(t.index, 0) << rows;
      EXPECT_LE(mla::TileSmemBytes(t.rows, t.stages), family.limits.smem_per_block_optin);
      EXPECT_GE(t.blocks_per_sm, 1);
      EXPECT_LE(t.blocks_per_sm *
                    (mla::TileSmemBytes(t.rows, t.stages) + family.limits.reserved_smem_per_block),
                family.limits.smem_per_sm);
      EXPECT_LE(t.blocks_per_sm * mla::TileThreads(t.rows), family.limits.max_threads_per_sm);
      EXPECT_LE(t.rows, mla::TileRowsFor(rows));
      // The plan's partial slots fit the workspace with the family's tile too.
      const int32_t parts = mla::NumPartsFor(family.limits.num_sms, rows, t.rows, t.blocks_per_sm);
      EXPECT_LE(2 * static_cast<int64_t>(parts) * rows, mla::PartialRowsFor(family.limits.num_sms));
    }
  }
}

TEST(MlaPlanTest, FamiliesTiles) {
  const auto tile = [](const char* family, int32_t rows) {
    const mla::TileChoice t =
        mla::ChooseTile(rows, mla::TileDeviceFrom(FindDeviceFamily(family)->limits));
    return std::to_string(t.rows) + "x" + std::to_string(t.stages) + "/" +
           std::to_string(t.blocks_per_sm);
  };
  // 227 KB blocks, 228 KB SMs: two 16-row blocks per SM, the deep rings.
  for (const char* big : {"sm_90", "sm_100"}) {
    EXPECT_EQ(tile(big, 16), "16x2/2");
    EXPECT_EQ(tile(big, 32), "32x4/1");
    EXPECT_EQ(tile(big, 64), "64x3/1");
    EXPECT_EQ(tile(big, 2048), "64x3/1");
  }
  // 163 KB blocks: one 16-row block per SM, shallower rings.
  EXPECT_EQ(tile("sm_80", 16), "16x2/1");
  EXPECT_EQ(tile("sm_80", 32), "32x3/1");
  EXPECT_EQ(tile("sm_80", 128), "64x2/1");
  // 99 KB blocks: 16-row tiles only.
  for (const char* small : {"sm_86", "sm_89", "sm_120"}) {
    EXPECT_EQ(tile(small, 16), "16x2/1");
    EXPECT_EQ(tile(small, 32), "16x2/1");
    EXPECT_EQ(tile(small, 2048), "16x2/1");
  }
  // The H200's portable plan as before: NumParts is the sm_90 family's tile.
  const mla::TileDevice h200 = mla::TileDeviceFrom(FindDeviceFamily("sm_90")->limits);
  for (int32_t rows : {16, 32, 64, 128, 2048}) {
    const mla::TileChoice t = mla::ChooseTile(rows, h200);
    EXPECT_EQ(mla::NumPartsFor(132, rows, t.rows, t.blocks_per_sm), mla::NumParts(132, rows));
  }
  // A block smaller than the 16-row tile: no tile, so the workspace refuses the device.
  mla::TileDevice tiny = h200;
  tiny.smem_per_block_optin = 48 << 10;
  EXPECT_EQ(mla::ChooseTile(16, tiny).index, -1);
}

TEST(MlaPlanTest, TilesAndParts) {
  EXPECT_EQ(mla::TileRowsFor(16), 16);
  EXPECT_EQ(mla::TileRowsFor(32), 32);
  EXPECT_EQ(mla::TileRowsFor(48), 64);
  EXPECT_EQ(mla::NumRowTiles(128 * 8), 16);
  EXPECT_EQ(mla::NumParts(132, 16), 264);  // two 16-row blocks per SM
  EXPECT_EQ(mla::NumParts(132, 64), 132);
  EXPECT_EQ(mla::NumParts(132, 128), 66);
  EXPECT_EQ(mla::NumParts(132, 2048), 4);
  EXPECT_EQ(mla::NumPartsSm90a(132, 16), 132);
  EXPECT_EQ(mla::NumPartsSm90a(132, 1024), 8);
  EXPECT_EQ(mla::UnitsOf(0), 1);
  EXPECT_EQ(mla::UnitsOf(64), 1);
  EXPECT_EQ(mla::UnitsOf(65), 2);
}

// The sm_90a tile's schedule: one page at a time for a single request within one 64-row tile,
// page pairs otherwise.
TEST(MlaPlanTest, Sm90aScheduleByRowsAndBatch) {
  for (int32_t rows : {16, 32, 48, 64}) {
    EXPECT_TRUE(mla::UseOnePageSchedule(rows, 1)) << rows;
    for (int32_t batch : {2, 8, 64, 256}) EXPECT_FALSE(mla::UseOnePageSchedule(rows, batch));
  }
  for (int32_t rows : {128, 256, 1024, 2048}) {
    for (int32_t batch : {1, 8, 128}) EXPECT_FALSE(mla::UseOnePageSchedule(rows, batch));
  }
  EXPECT_STREQ(MlaVerifySm90aScheduleName(MlaVerifySm90aSchedule::kAuto), "auto");
  EXPECT_STREQ(MlaVerifySm90aScheduleName(MlaVerifySm90aSchedule::kPagePairs), "page_pairs");
  EXPECT_STREQ(MlaVerifySm90aScheduleName(MlaVerifySm90aSchedule::kOnePage), "one_page");
  EXPECT_STREQ(MlaVerifySm90aScheduleName(MlaVerifySm90aSchedule::kSwapAb), "swap_ab");
}

// Swap-AB exists for 16 and 32 query rows only; a workspace that forces it gets it there and the
// plan's own choice elsewhere.
TEST(MlaPlanTest, SwapAbOnlyWhereItFits) {
  for (int32_t rows : {16, 32}) EXPECT_TRUE(mla::SwapAbFits(rows)) << rows;
  for (int32_t rows : {0, 8, 48, 64, 128, 2048}) EXPECT_FALSE(mla::SwapAbFits(rows)) << rows;
  EXPECT_TRUE(mla::UseSwapAbSchedule(16, 1));
  for (int32_t batch : {2, 8, 64, 128}) EXPECT_FALSE(mla::UseSwapAbSchedule(16, batch)) << batch;
  for (int32_t rows : {32, 64, 128, 2048}) {
    for (int32_t batch : {1, 8, 64}) EXPECT_FALSE(mla::UseSwapAbSchedule(rows, batch)) << rows;
  }
  MlaVerifyWorkspace ws;
  ws.sm90a_schedule = MlaVerifySm90aSchedule::kSwapAb;
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 16, 8), MlaVerifySm90aSchedule::kSwapAb);
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 32, 1), MlaVerifySm90aSchedule::kSwapAb);
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 64, 1), MlaVerifySm90aSchedule::kOnePage);
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 128, 1), MlaVerifySm90aSchedule::kPagePairs);
  ws.sm90a_schedule = MlaVerifySm90aSchedule::kPagePairs;
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 16, 1), MlaVerifySm90aSchedule::kPagePairs);
  ws.sm90a_schedule = MlaVerifySm90aSchedule::kAuto;
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 16, 1), MlaVerifySm90aSchedule::kSwapAb);
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 16, 8), MlaVerifySm90aSchedule::kPagePairs);
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 16, 64), MlaVerifySm90aSchedule::kPagePairs);
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 32, 1), MlaVerifySm90aSchedule::kOnePage);
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 32, 8), MlaVerifySm90aSchedule::kPagePairs);
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 64, 1), MlaVerifySm90aSchedule::kOnePage);
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 64, 8), MlaVerifySm90aSchedule::kPagePairs);
  EXPECT_EQ(ChooseMlaVerifySm90aSchedule(ws, 128, 1), MlaVerifySm90aSchedule::kPagePairs);
}

// ---------------------------------------------------------------------------------------------
// Launch checks (host side, no device needed).

TEST(MlaVerifyChecksTest, RejectsBadShapesAndAlignment) {
  MlaVerifyWorkspace ws;
  ws.max_batch = 8;
  alignas(16) static __nv_bfloat16 buf[64];
  alignas(16) static int32_t ints[8];
  MlaVerifyParams p;
  p.batch = 2;
  p.s_q = 2;
  p.h_q = 16;
  p.softmax_scale = 0.1f;
  p.q = buf;
  p.q_head_stride = 576;
  p.q_token_stride = 16 * 576;
  p.q_batch_stride = 2 * 16 * 576;
  p.kv_cache = buf;
  p.kv_row_stride = 576;
  p.kv_page_stride = 64 * 576;
  p.block_table = ints;
  p.block_table_batch_stride = 4;
  p.max_pages = 4;
  p.cache_seqlens = ints;
  p.out = buf;
  p.out_head_stride = 512;
  p.out_token_stride = 16 * 512;
  p.out_batch_stride = 2 * 16 * 512;
  EXPECT_EQ(CheckMlaVerifyParams(p, &ws), cudaSuccess);
  EXPECT_EQ(CheckMlaVerifyParams(p, nullptr), cudaErrorInvalidValue);
  auto expect_bad = [&](auto mutate) {
    MlaVerifyParams b = p;
    mutate(b);
    EXPECT_EQ(CheckMlaVerifyParams(b, &ws), cudaErrorInvalidValue);
  };
  expect_bad([](MlaVerifyParams& b) { b.batch = 9; });
  expect_bad([](MlaVerifyParams& b) { b.batch = 0; });
  expect_bad([](MlaVerifyParams& b) { b.s_q = 17; });
  expect_bad([](MlaVerifyParams& b) { b.h_q = 8; });
  expect_bad([](MlaVerifyParams& b) { b.h_q = 48; });
  expect_bad([](MlaVerifyParams& b) { b.q = buf + 1; });          // 2-byte aligned
  expect_bad([](MlaVerifyParams& b) { b.q_head_stride = 580; });  // not 16-byte rows
  expect_bad([](MlaVerifyParams& b) { b.kv_row_stride = 568; });  // narrower than a row
  expect_bad([](MlaVerifyParams& b) { b.out = nullptr; });
  expect_bad([](MlaVerifyParams& b) { b.softmax_scale = 0.0f; });
  expect_bad([](MlaVerifyParams& b) { b.block_table_batch_stride = 3; });
  EXPECT_STREQ(MlaVerifyPathName(MlaVerifyPath::kSplitKv), "split_kv");
  EXPECT_STREQ(MlaVerifyPathName(MlaVerifyPath::kBaseline), "baseline");
  EXPECT_STREQ(MlaVerifyPathName(MlaVerifyPath::kSplitKvSm90a), "split_kv_sm90a");
  ws.has_sm90a = false;
  EXPECT_EQ(ChooseMlaVerifyPath(ws, 128), MlaVerifyPath::kSplitKv);
  ws.has_sm90a = true;
  EXPECT_EQ(ChooseMlaVerifyPath(ws, 128), MlaVerifyPath::kSplitKvSm90a);
}

}  // namespace
}  // namespace probesidecar::kernels
