// The CPU reference of the tap's write and close (the semantics the GPU test holds the kernels
// to), step by step against hand-worked counters, and the ring layout.
#include <array>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/tap_write/tap_write.h"
#include "kernels/tap_write/tap_write_ref.h"

namespace probesidecar::kernels {
namespace {

// A host ring of K = 2 (slots 0-1 half 0, 2-3 half 1, 4 spare), max_batch 3, H 4, float32;
// slots and counts poisoned so that what is not written shows.
struct HostRing {
  static constexpr int kWindow = 2, kMaxBatch = 3, kHidden = 4, kSlots = 2 * kWindow + 1;
  std::vector<float> slots = std::vector<float>(kSlots * kMaxBatch * kHidden, -1.0f);
  std::vector<int32_t> counts = std::vector<int32_t>(kSlots, -7);
  int64_t meta[kTapMetaSize] = {0, kWindow, 0, 0, 0, 0, 0, 0};

  TapWriteParams Write(const void* src, int32_t n, int64_t stride) {
    TapWriteParams p;
    p.src = src;
    p.slots = slots.data();
    p.meta = meta;
    p.counts = counts.data();
    p.src_row_stride = stride;
    p.n = n;
    p.max_batch = kMaxBatch;
    p.hidden = kHidden;
    p.overflow_slot = 2 * kWindow;
    p.dtype = common::DType::kFloat32;
    return p;
  }
  float At(int slot, int row, int col) const {
    return slots[(slot * kMaxBatch + row) * kHidden + col];
  }
};

std::vector<float> Rows(int n, int64_t stride, float base) {
  std::vector<float> rows(n * stride, 999.0f);  // past H: must never be copied
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < HostRing::kHidden; ++c) rows[r * stride + c] = base + 10 * r + c;
  }
  return rows;
}

TEST(TapWriteRef, WritesFillTheWindowThenGoToTheSpareSlotAndCloseSwitchesHalves) {
  HostRing ring;
  const std::vector<float> a = Rows(2, 4, 100), b = Rows(3, 6, 200), c = Rows(1, 4, 300);
  ASSERT_TRUE(TapWriteRef(ring.Write(a.data(), 2, 4)));
  EXPECT_EQ(ring.counts[0], 2);
  EXPECT_EQ(ring.meta[kTapMetaNextSlot], 1);
  EXPECT_EQ(ring.meta[kTapMetaWrites], 1);
  EXPECT_EQ(ring.At(0, 1, 3), 113);
  EXPECT_EQ(ring.At(0, 2, 0), -1.0f);                    // past n: untouched
  ASSERT_TRUE(TapWriteRef(ring.Write(b.data(), 3, 6)));  // strided source
  EXPECT_EQ(ring.counts[1], 3);
  EXPECT_EQ(ring.At(1, 2, 3), 223);
  EXPECT_EQ(ring.meta[kTapMetaNextSlot], 2);  // at the limit
  // Past the window's end: the spare slot, the counter stays at the limit, the writes still count.
  ASSERT_TRUE(TapWriteRef(ring.Write(c.data(), 1, 4)));
  ASSERT_TRUE(TapWriteRef(ring.Write(a.data(), 2, 4)));
  EXPECT_EQ(ring.counts[4], 2);
  EXPECT_EQ(ring.At(4, 1, 0), 110);
  EXPECT_EQ(ring.counts[2], -7);  // half 1 untouched
  EXPECT_EQ(ring.At(2, 0, 0), -1.0f);
  EXPECT_EQ(ring.meta[kTapMetaNextSlot], 2);
  EXPECT_EQ(ring.meta[kTapMetaWrites], 4);
  EXPECT_EQ(ring.meta[kTapMetaTicket], 0);
  // Close half 0: its write count is kept, the next window is half 1.
  ASSERT_TRUE(TapCloseRef({ring.meta, 0, 2, 4}));
  EXPECT_EQ(ring.meta[kTapMetaHalfWrites + 0], 4);
  EXPECT_EQ(ring.meta[kTapMetaWrites], 0);
  ASSERT_TRUE(TapWriteRef(ring.Write(c.data(), 1, 4)));
  EXPECT_EQ(ring.counts[2], 1);
  EXPECT_EQ(ring.At(2, 0, 2), 302);
  EXPECT_EQ(ring.meta[kTapMetaNextSlot], 3);
  ASSERT_TRUE(TapCloseRef({ring.meta, 1, 0, 2}));
  EXPECT_EQ(ring.meta[kTapMetaHalfWrites + 1], 1);
  EXPECT_EQ(ring.meta[kTapMetaHalfWrites + 0], 4);  // half 0's count stays until it closes again
  EXPECT_EQ(ring.meta[kTapMetaNextSlot], 0);
  EXPECT_EQ(ring.meta[kTapMetaLimit], 2);
}

TEST(TapWriteRef, DeviceRowCountsAreClampedToTheRowsWritten) {
  HostRing ring;
  const std::vector<float> a = Rows(3, 4, 0);
  const int32_t counts32[] = {2, -5, 9};
  const int64_t counts64[] = {1, int64_t{1} << 40};
  const int32_t want[] = {2, 0, 3, 1, 3};
  TapWriteParams p = ring.Write(a.data(), 3, 4);
  for (int i = 0; i < 5; ++i) {
    p.num_rows32 = i < 3 ? &counts32[i] : nullptr;
    p.num_rows64 = i < 3 ? nullptr : &counts64[i - 3];
    ring.meta[kTapMetaNextSlot] = 0;
    ASSERT_TRUE(TapWriteRef(p));
    EXPECT_EQ(ring.counts[0], want[i]) << i;
  }
}

TEST(TapWriteRef, InvalidParamsAreRefusedAndWriteNothing) {
  HostRing ring;
  const std::vector<float> a = Rows(4, 4, 0);
  const int32_t one = 1;
  const int64_t one64 = 1;
  auto refused = [&](TapWriteParams p) {
    const int64_t meta0 = ring.meta[0];
    EXPECT_FALSE(TapWriteRef(p));
    EXPECT_EQ(ring.meta[0], meta0);
  };
  TapWriteParams p = ring.Write(a.data(), 4, 4);  // n > max_batch
  refused(p);
  p.n = 0;
  refused(p);
  p = ring.Write(a.data(), 1, 3);  // stride < H
  refused(p);
  p = ring.Write(a.data(), 1, 4);
  p.num_rows32 = &one;
  p.num_rows64 = &one64;  // two row counts
  refused(p);
  p = ring.Write(reinterpret_cast<const char*>(a.data()) + 2, 1, 4);  // misaligned for float32
  refused(p);
  p = ring.Write(a.data(), 1, 4);
  p.dtype = static_cast<common::DType>(7);
  refused(p);
  p = ring.Write(nullptr, 1, 4);
  refused(p);
  EXPECT_FALSE(TapCloseRef({ring.meta, 2, 0, 2}));
  EXPECT_FALSE(TapCloseRef({ring.meta, 0, 3, 2}));
  EXPECT_FALSE(TapCloseRef({nullptr, 0, 0, 2}));
  EXPECT_EQ(ring.counts, std::vector<int32_t>(HostRing::kSlots, -7));
}

TEST(TapWriteRef, TheCloseOfADivertedWindowKeepsTheHalfsWriteCount) {
  HostRing ring;
  const std::vector<float> a = Rows(1, 4, 0);
  ASSERT_TRUE(TapWriteRef(ring.Write(a.data(), 1, 4)));
  // Half 0's window (1 write) closes and diverts the next: its writes all go to the spare slot.
  ASSERT_TRUE(TapCloseRef({ring.meta, 0, 2, 2}));
  EXPECT_EQ(ring.meta[kTapMetaHalfWrites + 0], 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(TapWriteRef(ring.Write(a.data(), 1, 4)));
  EXPECT_EQ(ring.counts[2], -7);
  EXPECT_EQ(ring.counts[4], 1);
  EXPECT_EQ(ring.meta[kTapMetaWrites], 3);
  // The lost window's close records nothing: half 1's count stays its last scored window's.
  ring.meta[kTapMetaHalfWrites + 1] = 5;
  TapCloseParams lost{ring.meta, 1, 0, 2};
  lost.record_writes = false;
  ASSERT_TRUE(TapCloseRef(lost));
  EXPECT_EQ(ring.meta[kTapMetaHalfWrites + 1], 5);
  EXPECT_EQ(ring.meta[kTapMetaWrites], 0);
  EXPECT_EQ(ring.meta[kTapMetaNextSlot], 0);
  EXPECT_EQ(ring.meta[kTapMetaLimit], 2);
}

TEST(TapRingLayout, PartsAreAlignedInOrderAndDoNotOverlap) {
  for (const bool device_scores : {true, false}) {
    for (common::DType dtype :
         {common::DType::kFloat32, common::DType::kFloat16, common::DType::kBFloat16}) {
      const int window = 5, max_batch = 3, hidden = 7, probes = 3;
      const TapRingLayout l =
          MakeTapRingLayout(window, max_batch, hidden, probes, dtype, device_scores);
      const int64_t element = common::DTypeSize(dtype);
      EXPECT_EQ(l.slot_bytes, max_batch * hidden * element);
      EXPECT_EQ(l.element_size, element);
      EXPECT_EQ(l.window, window);
      EXPECT_EQ(l.max_batch, max_batch);
      EXPECT_EQ(l.hidden, hidden);
      EXPECT_EQ(l.num_probes, probes);
      std::vector<int64_t> starts = {l.slots}, sizes = {(2 * window + 1) * l.slot_bytes};
      if (device_scores) {
        starts.insert(starts.end(), {l.scores, l.rows});
        sizes.insert(sizes.end(), {2 * window * max_batch * probes * 4, window * max_batch * 4});
      } else {
        EXPECT_EQ(l.scores, -1);
        EXPECT_EQ(l.rows, -1);
      }
      starts.insert(starts.end(), {l.counts, l.gather, l.meta, l.total_bytes});
      sizes.insert(sizes.end(), {(2 * window + 1) * 4, max_batch * 4, kTapMetaSize * 8});
      EXPECT_EQ(l.slots, 0);
      for (size_t i = 0; i + 1 < starts.size(); ++i) {
        EXPECT_EQ(starts[i] % kTapRingAlign, 0) << i;
        EXPECT_GE(starts[i + 1], starts[i] + sizes[i]) << i;
        EXPECT_LT(starts[i + 1], starts[i] + sizes[i] + kTapRingAlign) << i;
      }
    }
  }
}

TEST(TapRingLayout, AWindowsPartsAreItsHalfsSlotsCountsScoresAndWriteCount) {
  const TapRingLayout l = MakeTapRingLayout(4, 3, 8, 2, common::DType::kBFloat16);
  const TapWindowParts w0 = MakeTapWindowParts(l, 0, 4), w1 = MakeTapWindowParts(l, 1, 2);
  EXPECT_EQ(w0.first_slot, 0);
  EXPECT_EQ(w0.rows, 12);
  EXPECT_EQ(w0.activations, l.slots);
  EXPECT_EQ(w0.counts, l.counts);
  EXPECT_EQ(w0.scores, l.scores);
  EXPECT_EQ(w0.device_rows, l.rows);
  EXPECT_EQ(w0.writes, l.meta + kTapMetaHalfWrites * 8);
  EXPECT_EQ(w1.first_slot, 4);
  EXPECT_EQ(w1.rows, 6);
  EXPECT_EQ(w1.activations, l.slots + 4 * 3 * 8 * 2);
  EXPECT_EQ(w1.counts, l.counts + 4 * 4);
  EXPECT_EQ(w1.scores, l.scores + 4 * 3 * 2 * 4);
  EXPECT_EQ(w1.writes, l.meta + (kTapMetaHalfWrites + 1) * 8);
  const TapRingLayout host = MakeTapRingLayout(4, 3, 8, 2, common::DType::kBFloat16, false);
  EXPECT_EQ(MakeTapWindowParts(host, 1, 2).scores, -1);
  EXPECT_EQ(MakeTapWindowParts(host, 1, 2).device_rows, -1);
}

TEST(TapRingLayout, ANewRingsCountersPointAtHalfZeroAndAreNotArmed) {
  constexpr std::array<int64_t, kTapMetaSize> meta = TapInitialMeta(6);
  EXPECT_EQ(meta,
            (std::array<int64_t, kTapMetaSize>{0, 6, 0, 0, 0, 0, kTapArmedOff, kTapArmedOff}));
}

}  // namespace
}  // namespace probesidecar::kernels
