// The CPU reference of the tap's write and close (the semantics the GPU test holds the kernels
// to), step by step against hand-worked counters, and the ring layout.
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

TEST(TapRingLayout, PartsAreAlignedInOrderAndDoNotOverlap) {
  for (common::DType dtype :
       {common::DType::kFloat32, common::DType::kFloat16, common::DType::kBFloat16}) {
    const int window = 5, max_batch = 3, hidden = 7, probes = 3;
    const TapRingLayout l = MakeTapRingLayout(window, max_batch, hidden, probes, dtype);
    const int64_t element = common::DTypeSize(dtype);
    EXPECT_EQ(l.slot_bytes, max_batch * hidden * element);
    const int64_t starts[] = {l.slots, l.scores, l.rows, l.counts, l.meta, l.total_bytes};
    const int64_t sizes[] = {(2 * window + 1) * l.slot_bytes, 2 * window * max_batch * probes * 4,
                             window * max_batch * 4, (2 * window + 1) * 4, kTapMetaSize * 8};
    EXPECT_EQ(l.slots, 0);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(starts[i] % 256, 0) << i;
      EXPECT_GE(starts[i + 1], starts[i] + sizes[i]) << i;
      EXPECT_LT(starts[i + 1], starts[i] + sizes[i] + 256) << i;
    }
  }
}

}  // namespace
}  // namespace probesidecar::kernels
