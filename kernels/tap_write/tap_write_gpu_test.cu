// The tap's write and close kernels on the GPU, every byte of the ring against the CPU reference
// (tap_write_ref.cc): rings poisoned with NaN, bf16/fp16/fp32, strided and misaligned sources,
// every row count from 1 to max_batch, writes past a window's end, device-resident row counts
// (int32 and int64, clamped), many blocks per launch, and writes captured in a CUDA graph whose
// replays leave the ring bit-equal to the same writes made eagerly.
#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/tap_write/tap_protocol_script.h"
#include "kernels/tap_write/tap_write.h"
#include "kernels/tap_write/tap_write_ref.h"
#include "kernels/blocks/gpu_test_main.h"

namespace probesidecar::kernels {
namespace {

using common::DType;
using tap_protocol::CompareRings;
using tap_protocol::PoisonedRing;

#define ASSERT_CUDA(call)                                                          \
  do {                                                                             \
    const cudaError_t error_ = (call);                                             \
    ASSERT_EQ(error_, cudaSuccess) << #call << ": " << cudaGetErrorString(error_); \
  } while (0)
#define EXPECT_CUDA(call)                                                          \
  do {                                                                             \
    const cudaError_t error_ = (call);                                             \
    EXPECT_EQ(error_, cudaSuccess) << #call << ": " << cudaGetErrorString(error_); \
  } while (0)

// A tap ring on the device and the reference's copy of it on the host, both laid out by
// MakeTapRingLayout and poisoned (PoisonedRing: 0xff bytes, NaN in every dtype, -1 in counts,
// except the counters, which start as a new tap's do).
class Ring {
 public:
  Ring(int32_t window, int32_t max_batch, int32_t hidden, DType dtype)
      : window_(window),
        layout_(MakeTapRingLayout(window, max_batch, hidden, /*num_probes=*/3, dtype)),
        host_(PoisonedRing(layout_)) {
    error_ = cudaMalloc(&device_, layout_.total_bytes);
    if (error_ == cudaSuccess) {
      error_ = cudaMemcpy(device_, host_.data(), host_.size(), cudaMemcpyHostToDevice);
    }
  }
  ~Ring() { cudaFree(device_); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  cudaError_t error() const { return error_; }

  // The params of a write, on the device (host = false) or on the reference's copy.
  TapWriteParams Write(bool host, const void* src, int32_t n, int64_t stride) {
    TapWriteParams p =
        TapRingWriteParams(layout_, host ? static_cast<void*>(host_.data()) : device_);
    p.src = src;
    p.src_row_stride = stride;
    p.n = n;
    return p;
  }
  TapCloseParams Close(bool host, int32_t half) {
    uint8_t* base = host ? host_.data() : static_cast<uint8_t*>(device_);
    const int64_t next = (1 - half) * int64_t{window_};
    return {reinterpret_cast<int64_t*>(base + layout_.meta), half, next, next + window_};
  }

  // Every byte of the device ring against the reference's (or against another ring's device
  // bytes, with `other`).
  void ExpectEqual(const std::string& where, const Ring* other = nullptr) {
    std::vector<uint8_t> got(host_.size());
    ASSERT_CUDA(cudaMemcpy(got.data(), device_, got.size(), cudaMemcpyDeviceToHost));
    std::vector<uint8_t> want = host_;
    if (other != nullptr) {
      ASSERT_CUDA(cudaMemcpy(want.data(), other->device_, want.size(), cudaMemcpyDeviceToHost));
    }
    const std::string difference = CompareRings(want, got, layout_, where);
    if (!difference.empty()) ADD_FAILURE() << difference;
  }

  int64_t HostMeta(int i) const {
    int64_t v;
    std::memcpy(&v, host_.data() + layout_.meta + 8 * i, 8);
    return v;
  }

 private:
  int32_t window_;
  TapRingLayout layout_;
  std::vector<uint8_t> host_;
  void* device_ = nullptr;
  cudaError_t error_ = cudaSuccess;
};

// Source rows on the device and the same bytes on the host: `rows` rows of `stride` elements,
// finite random values, starting `offset` elements into the allocation (offset 1 makes every
// 16-bit row start off a 4-byte boundary).
class Source {
 public:
  Source(int32_t rows, int64_t stride, int64_t offset, DType dtype, uint32_t seed)
      : element_(common::DTypeSize(dtype)),
        offset_(offset),
        host_((rows * stride + offset) * element_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (int64_t i = 0; i < rows * stride + offset; ++i) {
      const float v = normal(rng);
      if (dtype == DType::kFloat32) {
        std::memcpy(&host_[i * 4], &v, 4);
      } else {
        const uint16_t bits =
            dtype == DType::kFloat16 ? common::FloatToHalf(v) : common::FloatToBf16(v);
        std::memcpy(&host_[i * 2], &bits, 2);
      }
    }
    error_ = cudaMalloc(&device_, host_.size());
    if (error_ == cudaSuccess) error_ = Upload();
  }
  ~Source() { cudaFree(device_); }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  cudaError_t error() const { return error_; }
  cudaError_t Upload() {
    return cudaMemcpy(device_, host_.data(), host_.size(), cudaMemcpyHostToDevice);
  }
  const void* device() const { return static_cast<const uint8_t*>(device_) + offset_ * element_; }
  const void* host() const { return host_.data() + offset_ * element_; }
  // New contents (same positions), for a graph that reads the same address every replay.
  void Shuffle(uint32_t seed) {
    std::mt19937 rng(seed);
    for (size_t i = offset_ * element_; i + element_ <= host_.size(); i += element_) {
      const size_t j = offset_ * element_ +
                       (rng() % ((host_.size() - offset_ * element_) / element_)) * element_;
      for (int b = 0; b < element_; ++b) std::swap(host_[i + b], host_[j + b]);
    }
  }

 private:
  int element_;
  int64_t offset_;
  std::vector<uint8_t> host_;
  void* device_ = nullptr;
  cudaError_t error_ = cudaSuccess;
};

class TapWriteTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    ASSERT_CUDA(PrepareTapKernels());
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override { EXPECT_CUDA(cudaStreamDestroy(stream_)); }

  // One write on both copies of `ring` (device rows from `src`), with an optional row count at
  // index `count_index` of the int32 or int64 count arrays.
  void Write(Ring& ring, const Source& src, int32_t n, int64_t stride, int count_kind = 0,
             int count_index = 0) {
    TapWriteParams d = ring.Write(false, src.device(), n, stride);
    TapWriteParams h = ring.Write(true, src.host(), n, stride);
    if (count_kind == 1) {
      d.num_rows32 = counts32_device_ + count_index;
      h.num_rows32 = counts32_.data() + count_index;
    } else if (count_kind == 2) {
      d.num_rows64 = counts64_device_ + count_index;
      h.num_rows64 = counts64_.data() + count_index;
    }
    ASSERT_CUDA(LaunchTapWrite(d, stream_));
    ASSERT_TRUE(TapWriteRef(h));
  }
  void Close(Ring& ring, int32_t half) {
    ASSERT_CUDA(LaunchTapClose(ring.Close(false, half), stream_));
    ASSERT_TRUE(TapCloseRef(ring.Close(true, half)));
  }
  // Row counts read on the GPU: some in range, some not (the kernel clamps them).
  void MakeCounts(int size, int32_t max_batch) {
    std::mt19937 rng(size);
    counts32_.resize(size);
    counts64_.resize(size);
    for (int i = 0; i < size; ++i) {
      counts32_[i] = static_cast<int32_t>(rng() % (max_batch + 5)) - 2;
      counts64_[i] = i % 7 == 3 ? (int64_t{1} << 40) : counts32_[i];
    }
    ASSERT_CUDA(cudaMalloc(&counts32_device_, size * sizeof(int32_t)));
    ASSERT_CUDA(cudaMalloc(&counts64_device_, size * sizeof(int64_t)));
    ASSERT_CUDA(cudaMemcpy(counts32_device_, counts32_.data(), size * sizeof(int32_t),
                           cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(counts64_device_, counts64_.data(), size * sizeof(int64_t),
                           cudaMemcpyHostToDevice));
  }
  void FreeCounts() {
    EXPECT_CUDA(cudaFree(counts32_device_));
    EXPECT_CUDA(cudaFree(counts64_device_));
    counts32_device_ = nullptr;
    counts64_device_ = nullptr;
  }

  cudaStream_t stream_ = nullptr;
  std::vector<int32_t> counts32_;
  std::vector<int64_t> counts64_;
  int32_t* counts32_device_ = nullptr;
  int64_t* counts64_device_ = nullptr;
};

// Windows of every kind (full, past the end, partial, empty) on small rings of several shapes,
// sources contiguous, strided and misaligned; the ring compared after every window.
TEST_P(TapWriteTest, EagerWritesAndClosesMatchTheReferenceByteForByte) {
  const DType dtype = GetParam();
  const int32_t max_batch = 8, window = 3;
  MakeCounts(64, max_batch);
  struct Shape {
    int32_t hidden;
    int64_t stride_extra, offset;
  };
  // Copies of 16-, 8-, 4- and 2-byte units.
  for (const Shape& s : {Shape{64, 0, 0}, Shape{64, 8, 0}, Shape{12, 0, 0}, Shape{6, 2, 2},
                         Shape{1000, 3, 1}, Shape{5, 0, 1}, Shape{1, 0, 0}, Shape{1, 2, 1}}) {
    SCOPED_TRACE("H " + std::to_string(s.hidden) + " stride +" + std::to_string(s.stride_extra) +
                 " offset " + std::to_string(s.offset));
    const int64_t stride = s.hidden + s.stride_extra;
    Ring ring(window, max_batch, s.hidden, dtype);
    ASSERT_CUDA(ring.error());
    Source src(max_batch, stride, s.offset, dtype, static_cast<uint32_t>(s.hidden));
    ASSERT_CUDA(src.error());
    const int steps_per_window[] = {3, 5, 1, 3, 0, 4, 2, 3};
    int write = 0, half = 0;
    for (int w = 0; w < 8; ++w) {
      for (int t = 0; t < steps_per_window[w]; ++t, ++write) {
        const int32_t n = 1 + (write * 3) % max_batch;
        Write(ring, src, n, stride, write % 3, write);
      }
      Close(ring, half);
      ASSERT_CUDA(cudaStreamSynchronize(stream_));
      ring.ExpectEqual("after window " + std::to_string(w));
      // The closed window's write count, past-the-end writes included.
      EXPECT_EQ(ring.HostMeta(kTapMetaHalfWrites + half), steps_per_window[w]);
      half = 1 - half;
    }
  }
  FreeCounts();
}

// Every row count 1..max_batch into its own slot, with long rows (several blocks per row), then
// a launch of many blocks written again and again past the end (the ticket across 1000+ blocks).
TEST_P(TapWriteTest, EveryRowCountAndManyBlocksPerLaunch) {
  const DType dtype = GetParam();
  {
    const int32_t max_batch = 64, hidden = 4096;
    Ring ring(max_batch, max_batch, hidden, dtype);
    ASSERT_CUDA(ring.error());
    Source src(max_batch, hidden + 64, 0, dtype, 5);
    ASSERT_CUDA(src.error());
    for (int32_t n = 1; n <= max_batch; ++n) Write(ring, src, n, hidden + 64);
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    ring.ExpectEqual("n = 1..64");
  }
  {
    const int32_t max_batch = 256, hidden = 8192, window = 2;
    Ring ring(window, max_batch, hidden, dtype);
    ASSERT_CUDA(ring.error());
    Source src(max_batch, hidden, 0, dtype, 6);
    ASSERT_CUDA(src.error());
    for (int i = 0; i < 24; ++i) Write(ring, src, i % 3 == 0 ? max_batch : max_batch - i, hidden);
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    EXPECT_EQ(ring.HostMeta(kTapMetaWrites), 24);
    EXPECT_EQ(ring.HostMeta(kTapMetaNextSlot), window);
    ring.ExpectEqual("256 rows x 8192, 24 writes");
  }
}

// The write inside a captured graph (its source and row count at fixed addresses, their contents
// changed on the stream between replays), and a second graph that also closes its windows:
// replay after replay, the ring is bit-equal to the same writes made eagerly, and to the
// reference.
TEST_P(TapWriteTest, GraphReplaysAreBitEqualToEagerWrites) {
  const DType dtype = GetParam();
  const int32_t max_batch = 16, window = 4, hidden = 320;
  const int64_t stride = hidden + 16;
  Ring graphed(window, max_batch, hidden, dtype), eager(window, max_batch, hidden, dtype);
  ASSERT_CUDA(graphed.error());
  ASSERT_CUDA(eager.error());
  Source a(max_batch, stride, 0, dtype, 1), b(max_batch, hidden, 1, dtype, 2);
  ASSERT_CUDA(a.error());
  ASSERT_CUDA(b.error());
  int32_t* count = nullptr;  // the loop's device row count for `a`'s write
  ASSERT_CUDA(cudaMalloc(&count, sizeof(int32_t)));
  int32_t count_host = max_batch;

  // Graph 1: two writes (a with the device row count, b with n), no close.
  // Graph 2: write a, close half 0, write b, write a, close half 1: windows of 1 and 2 steps.
  auto capture = [&](bool closes, cudaGraphExec_t* exec) {
    cudaGraph_t graph = nullptr;
    ASSERT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    TapWriteParams wa = graphed.Write(false, a.device(), max_batch, stride);
    wa.num_rows32 = count;
    const TapWriteParams wb = graphed.Write(false, b.device(), max_batch - 3, hidden);
    ASSERT_CUDA(LaunchTapWrite(wa, stream_));
    if (closes) ASSERT_CUDA(LaunchTapClose(graphed.Close(false, 0), stream_));
    ASSERT_CUDA(LaunchTapWrite(wb, stream_));
    if (closes) {
      ASSERT_CUDA(LaunchTapWrite(wa, stream_));
      ASSERT_CUDA(LaunchTapClose(graphed.Close(false, 1), stream_));
    }
    ASSERT_CUDA(cudaStreamEndCapture(stream_, &graph));
    ASSERT_CUDA(cudaGraphInstantiate(exec, graph, 0));
    ASSERT_CUDA(cudaGraphDestroy(graph));
  };
  // The same on `eager` (launched now) and on the reference copy.
  auto replay_eagerly = [&](bool closes) {
    for (int copy = 0; copy < 2; ++copy) {
      const bool host = copy == 1;
      TapWriteParams wa = eager.Write(host, host ? a.host() : a.device(), max_batch, stride);
      wa.num_rows32 = host ? &count_host : count;
      const TapWriteParams wb =
          eager.Write(host, host ? b.host() : b.device(), max_batch - 3, hidden);
      auto write = [&](const TapWriteParams& p) {
        if (host) {
          ASSERT_TRUE(TapWriteRef(p));
        } else {
          ASSERT_CUDA(LaunchTapWrite(p, stream_));
        }
      };
      auto close = [&](int32_t half) {
        if (host) {
          ASSERT_TRUE(TapCloseRef(eager.Close(true, half)));
        } else {
          ASSERT_CUDA(LaunchTapClose(eager.Close(false, half), stream_));
        }
      };
      write(wa);
      if (closes) close(0);
      write(wb);
      if (closes) {
        write(wa);
        close(1);
      }
    }
  };

  cudaGraphExec_t plain = nullptr, closing = nullptr;
  capture(false, &plain);
  capture(true, &closing);
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  graphed.ExpectEqual("after capture (nothing ran)", &eager);
  int half = 0;
  for (int replay = 0; replay < 20; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    // New rows and a new row count at the same addresses (the previous replay has finished).
    a.Shuffle(100 + replay);
    b.Shuffle(200 + replay);
    ASSERT_CUDA(a.Upload());
    ASSERT_CUDA(b.Upload());
    count_host = static_cast<int32_t>((replay * 7) % (max_batch + 3)) - 1;
    ASSERT_CUDA(cudaMemcpy(count, &count_host, sizeof(int32_t), cudaMemcpyHostToDevice));
    const bool closes = replay >= 12;
    if (!closes && replay % 3 == 2) {
      // Eager closes between replays of the plain graph: windows of 4 writes, then of 6 (two
      // past the end of the 4-slot window).
      ASSERT_CUDA(LaunchTapClose(graphed.Close(false, half), stream_));
      ASSERT_CUDA(LaunchTapClose(eager.Close(false, half), stream_));
      ASSERT_TRUE(TapCloseRef(eager.Close(true, half)));
      half = 1 - half;
    }
    if (closes && replay == 12 && half == 1) {
      // The closing graph starts from half 0.
      ASSERT_CUDA(LaunchTapClose(graphed.Close(false, 1), stream_));
      ASSERT_CUDA(LaunchTapClose(eager.Close(false, 1), stream_));
      ASSERT_TRUE(TapCloseRef(eager.Close(true, 1)));
      half = 0;
    }
    ASSERT_CUDA(cudaGraphLaunch(closes ? closing : plain, stream_));
    replay_eagerly(closes);
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    graphed.ExpectEqual("graphed vs eager", &eager);
    eager.ExpectEqual("eager vs reference");
  }
  ASSERT_CUDA(cudaGraphExecDestroy(plain));
  ASSERT_CUDA(cudaGraphExecDestroy(closing));
  ASSERT_CUDA(cudaFree(count));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TapWriteTest,
                         ::testing::Values(DType::kBFloat16, DType::kFloat16, DType::kFloat32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(common::DTypeName(info.param));
                         });

TEST(TapWriteValidation, OutOfRangeParamsAreRefusedBeforeAnyLaunch) {
  TapWriteParams p;
  EXPECT_EQ(LaunchTapWrite(p, nullptr), cudaErrorInvalidValue);  // no pointers
  int64_t meta[kTapMetaSize] = {};
  int32_t counts[5] = {};
  uint16_t rows[16] = {};
  p.src = rows;
  p.slots = rows;
  p.meta = meta;
  p.counts = counts;
  p.n = 3;
  p.max_batch = 2;  // n > max_batch
  p.hidden = 4;
  p.src_row_stride = 4;
  p.overflow_slot = 4;
  EXPECT_EQ(LaunchTapWrite(p, nullptr), cudaErrorInvalidValue);
  p.n = 2;
  p.src_row_stride = 3;  // shorter than a row
  EXPECT_EQ(LaunchTapWrite(p, nullptr), cudaErrorInvalidValue);
  p.src_row_stride = 4;
  p.dtype = DType::kFloat32;
  p.src = reinterpret_cast<const uint8_t*>(rows) + 2;  // misaligned for float32
  EXPECT_EQ(LaunchTapWrite(p, nullptr), cudaErrorInvalidValue);
  TapCloseParams c{meta, 2, 0, 4};  // no half 2
  EXPECT_EQ(LaunchTapClose(c, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // nothing was launched
}

}  // namespace
}  // namespace probesidecar::kernels

int main(int argc, char** argv) {
  return probesidecar::kernels::gpu_test::RunGpuTests(argc, argv);
}
