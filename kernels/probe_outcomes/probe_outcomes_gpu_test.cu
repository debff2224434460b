// The count of probe outcomes on the GPU equals the host count word for word (the sums to float
// rounding), over shapes that take every grid form (one tile or several, a partial last tile, rows
// fewer than a pass, many passes), with NaN and infinities, strided scores, probes without
// thresholds, no bounds and the most bounds; the copy into host-mapped memory is exact; the
// request's non-finite count (where asked) and the running total are kept and the scratch left
// zero; and a captured graph whose descriptor changes between replays counts every replay.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/blocks/gpu_test_main.h"
#include "kernels/probe_outcomes/probe_outcomes.h"

namespace probesidecar::kernels {
namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t Bits(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

struct Shape {
  int rows;    // R
  int bucket;  // launch shape, >= R
  int probes;  // P
  int bounds;  // B
  int stride;  // >= P
};

// Scores in [-0.5, 1.5) (some on the bounds exactly), every 37th NaN or +-Inf.
std::vector<float> Scores(const Shape& s, uint32_t seed, const std::vector<float>& bounds) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.5f, 1.5f);
  std::vector<float> scores(static_cast<size_t>(s.rows) * s.stride, 7.0f);
  for (int r = 0; r < s.rows; ++r) {
    for (int p = 0; p < s.probes; ++p) {
      float v = uniform(rng);
      const uint32_t pick = rng() % 37;
      if (pick == 0) v = kNaN;
      if (pick == 1) v = (rng() & 1) ? INFINITY : -INFINITY;
      if (pick == 2 && !bounds.empty()) v = bounds[rng() % bounds.size()];
      scores[static_cast<size_t>(r) * s.stride + p] = v;
    }
  }
  return scores;
}

std::vector<float> Bounds(int n) {
  std::vector<float> bounds;
  for (int i = 1; i <= n; ++i) bounds.push_back(static_cast<float>(i) / n);
  return bounds;
}

std::vector<float> Thresholds(int probes) {
  std::vector<float> t(probes);
  for (int p = 0; p < probes; ++p) t[p] = p % 3 == 2 ? kNaN : 0.25f * static_cast<float>(p % 5);
  return t;
}

void ExpectSameCounts(const ProbeOutcomeCounts& want, const ProbeOutcomeCounts& got,
                      const char* what) {
  const ProbeOutcomeLayout& l = want.layout;
  ASSERT_EQ(want.words.size(), got.words.size());
  for (int32_t s = 0; s < want.slots; ++s) {
    ASSERT_EQ(want.rows(s), got.rows(s)) << what;
    for (int32_t p = 0; p < l.num_probes; ++p) {
      ASSERT_EQ(want.fired(s, p), got.fired(s, p)) << what << " probe " << p;
      ASSERT_EQ(want.non_finite(s, p), got.non_finite(s, p)) << what << " probe " << p;
      for (int32_t b = 0; b <= l.num_bounds; ++b) {
        ASSERT_EQ(want.bucket(s, p, b), got.bucket(s, p, b))
            << what << " probe " << p << " b " << b;
      }
      ASSERT_NEAR(want.sum(s, p), got.sum(s, p), 1e-4 * (1 + std::fabs(want.sum(s, p))))
          << what << " probe " << p;
    }
  }
}

// The words a host count added (CountProbeOutcomesCpu), as one label slot's counts.
ProbeOutcomeCounts HostCounts(const ProbeOutcomeLayout& layout,
                              const std::vector<std::atomic<uint64_t>>& words) {
  ProbeOutcomeCounts counts(layout, 1);
  for (size_t i = 0; i < words.size(); ++i) counts.words[i] = words[i].load();
  return counts;
}

// One label slot's counters on the device against `want`.
void ExpectDeviceCounts(const ProbeOutcomeCounts& want, const unsigned long long* counters,
                        const char* what) {
  ProbeOutcomeCounts got(want.layout, 1);
  ASSERT_CUDA(cudaMemcpy(got.words.data(), counters, sizeof(uint64_t) * got.words.size(),
                         cudaMemcpyDeviceToHost));
  ExpectSameCounts(want, got, what);
}

class CountProbeOutcomesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ASSERT_CUDA(cudaMalloc(&descriptor_, sizeof(ProbeOutcomeDescriptor)));
    ASSERT_CUDA(cudaMalloc(&scratch_, 2 * sizeof(uint32_t)));
    ASSERT_CUDA(cudaMemset(scratch_, 0, 2 * sizeof(uint32_t)));
    ASSERT_CUDA(cudaHostAlloc(&counts_, sizeof(uint32_t), cudaHostAllocMapped));
    ASSERT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&counts_device_), counts_, 0));
    counts_[0] = 99;
    ASSERT_CUDA(cudaMalloc(&total_, sizeof(unsigned long long)));
    ASSERT_CUDA(cudaMemset(total_, 0, sizeof(unsigned long long)));
  }
  void TearDown() override {
    cudaFree(descriptor_);
    cudaFree(scratch_);
    cudaFreeHost(counts_);
    cudaFree(total_);
    cudaStreamDestroy(stream_);
  }
  // The last request's published non-finite count.
  uint32_t Published() const { return reinterpret_cast<volatile uint32_t*>(counts_)[0]; }
  // The running total of requests with add_to_total.
  uint64_t Total() const {
    unsigned long long total = 0;
    EXPECT_EQ(cudaMemcpy(&total, total_, sizeof(total), cudaMemcpyDeviceToHost), cudaSuccess);
    return total;
  }
  // The count of shape `s` against `tables`, reading this fixture's descriptor and keeping its
  // scratch, running total and published count.
  CountProbeOutcomesParams Params(const ProbeOutcomeTables& tables, const Shape& s) const {
    CountProbeOutcomesParams p;
    p.descriptor = descriptor_;
    p.thresholds = tables.thresholds;
    p.bounds = tables.bounds;
    p.num_probes = s.probes;
    p.num_bounds = s.bounds;
    p.bucket = s.bucket;
    p.scratch = scratch_;
    p.non_finite_total = total_;
    p.request_non_finite = counts_device_;
    return p;
  }

  cudaStream_t stream_ = nullptr;
  ProbeOutcomeDescriptor* descriptor_ = nullptr;
  uint32_t* scratch_ = nullptr;
  uint32_t* counts_ = nullptr;  // mapped [1]: the published count
  uint32_t* counts_device_ = nullptr;
  unsigned long long* total_ = nullptr;  // device [1]: the running total
};

TEST_F(CountProbeOutcomesTest, EqualsTheHostCountForEveryGridForm) {
  const Shape shapes[] = {
      {1, 1, 4, 20, 4},         {1, 64, 1, 0, 1},           {7, 8, 3, 3, 5},
      {64, 64, 4, 20, 4},       {1000, 1024, 100, 32, 101}, {8192, 8192, 4, 20, 4},
      {300, 512, 300, 20, 300}, {129, 256, 128, 7, 130},    {5000, 8192, 257, 1, 257},
      {65, 128, 1, 5, 1},       {65, 65, 3, 32, 3},
  };
  uint32_t seed = 1;
  uint32_t total = 0;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "R=" << s.rows << " bucket=" << s.bucket << " P=" << s.probes
                                    << " B=" << s.bounds);
    const std::vector<float> bounds = Bounds(s.bounds);
    const std::vector<float> thresholds = Thresholds(s.probes);
    const std::vector<float> scores = Scores(s, seed++, bounds);
    const ProbeOutcomeLayout layout{s.probes, s.bounds};

    ProbeOutcomeTables tables;
    ASSERT_CUDA(CreateProbeOutcomeTables(thresholds.data(), bounds.data(), layout, &tables));
    unsigned long long* counters = nullptr;
    ASSERT_CUDA(CreateProbeOutcomeCounters(layout, stream_, &counters));
    float* d_scores = nullptr;
    ASSERT_CUDA(cudaMalloc(&d_scores, sizeof(float) * scores.size()));
    ASSERT_CUDA(
        cudaMemcpy(d_scores, scores.data(), sizeof(float) * scores.size(), cudaMemcpyHostToDevice));
    float* copy = nullptr;  // mapped, [R, P]
    float* copy_device = nullptr;
    ASSERT_CUDA(cudaHostAlloc(&copy, sizeof(float) * s.rows * s.probes, cudaHostAllocMapped));
    ASSERT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&copy_device), copy, 0));
    std::memset(copy, 0xff, sizeof(float) * s.rows * s.probes);

    ProbeOutcomeDescriptor d;
    d.scores = d_scores;
    d.scores_row_stride = s.stride;
    d.copy_to = copy_device;
    d.copy_row_stride = s.probes;
    d.counters = counters;
    d.num_rows = s.rows;
    d.add_to_total = 1;
    d.publish_count = 1;
    ASSERT_CUDA(cudaMemcpyAsync(descriptor_, &d, sizeof(d), cudaMemcpyHostToDevice, stream_));
    const CountProbeOutcomesParams p = Params(tables, s);
    // Twice: the counts double, the scratch is left zero between launches.
    ASSERT_CUDA(LaunchCountProbeOutcomes(p, stream_));
    ASSERT_CUDA(LaunchCountProbeOutcomes(p, stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));

    std::vector<std::atomic<uint64_t>> host(static_cast<size_t>(layout.SlotWords()));
    const ProbeOutcomeCpuParams cpu{scores.data(), s.stride, thresholds.data(), bounds.data(),
                                    layout};
    CountProbeOutcomesCpu(cpu, 0, s.rows, host.data());
    CountProbeOutcomesCpu(cpu, 0, s.rows, host.data());
    ExpectDeviceCounts(HostCounts(layout, host), counters, "device vs host");

    uint32_t non_finite = 0;
    for (int r = 0; r < s.rows; ++r) {
      for (int c = 0; c < s.probes; ++c) {
        const float v = scores[static_cast<size_t>(r) * s.stride + c];
        non_finite += std::isfinite(v) ? 0 : 1;
        ASSERT_EQ(Bits(copy[r * s.probes + c]), Bits(v)) << r << "," << c;
      }
    }
    total += 2 * non_finite;
    EXPECT_EQ(Published(), non_finite);
    EXPECT_EQ(Total(), total);
    uint32_t left[2] = {1, 1};
    ASSERT_CUDA(cudaMemcpy(left, scratch_, sizeof(left), cudaMemcpyDeviceToHost));
    EXPECT_EQ(left[0], 0u);
    EXPECT_EQ(left[1], 0u);

    cudaFree(d_scores);
    cudaFreeHost(copy);
    cudaFree(counters);
    DestroyProbeOutcomeTables(&tables);
  }
}

// One captured graph (the count of one shape, as the server's graph holds it), its descriptor
// rewritten before each replay: other rows, other scores, another label slot, a request that
// counts nothing, and add_to_total off.
TEST_F(CountProbeOutcomesTest, AGraphReplayedWithChangingDescriptorsCountsEveryReplay) {
  const Shape s{0, 256, 5, 20, 5};
  const std::vector<float> bounds = Bounds(s.bounds);
  const std::vector<float> thresholds = Thresholds(s.probes);
  const ProbeOutcomeLayout layout{s.probes, s.bounds};
  ProbeOutcomeTables tables;
  ASSERT_CUDA(CreateProbeOutcomeTables(thresholds.data(), bounds.data(), layout, &tables));
  unsigned long long* slots[2] = {nullptr, nullptr};
  for (auto& slot : slots) ASSERT_CUDA(CreateProbeOutcomeCounters(layout, stream_, &slot));
  float* d_scores = nullptr;
  ASSERT_CUDA(cudaMalloc(&d_scores, sizeof(float) * s.bucket * s.stride));

  const CountProbeOutcomesParams p = Params(tables, s);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  ASSERT_CUDA(LaunchCountProbeOutcomes(p, stream_));
  ASSERT_CUDA(cudaStreamEndCapture(stream_, &graph));
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<std::atomic<uint64_t>> want[2] = {
      std::vector<std::atomic<uint64_t>>(static_cast<size_t>(layout.SlotWords())),
      std::vector<std::atomic<uint64_t>>(static_cast<size_t>(layout.SlotWords()))};
  uint32_t total = 0;
  for (int replay = 0; replay < 300; ++replay) {
    Shape shape = s;
    shape.rows = 1 + (replay * 37) % s.bucket;
    const std::vector<float> scores = Scores(shape, 1000 + replay, bounds);
    ASSERT_CUDA(cudaMemcpyAsync(d_scores, scores.data(), sizeof(float) * scores.size(),
                                cudaMemcpyHostToDevice, stream_));
    const int slot = replay % 2;
    const bool counted = replay % 7 != 3;
    const bool add_to_total = replay % 5 != 0;
    const bool publish = replay % 3 != 1;
    ProbeOutcomeDescriptor d;
    d.scores = d_scores;
    d.scores_row_stride = s.stride;
    d.counters = counted ? slots[slot] : nullptr;
    d.num_rows = shape.rows;
    d.add_to_total = add_to_total ? 1 : 0;
    d.publish_count = publish ? 1 : 0;
    counts_[0] = 12345;  // what a request that does not publish leaves as it is
    ASSERT_CUDA(cudaMemcpyAsync(descriptor_, &d, sizeof(d), cudaMemcpyHostToDevice, stream_));
    ASSERT_CUDA(cudaGraphLaunch(exec, stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));  // `scores` is reused by the next replay
    if (counted) {
      const ProbeOutcomeCpuParams cpu{scores.data(), s.stride, thresholds.data(), bounds.data(),
                                      layout};
      CountProbeOutcomesCpu(cpu, 0, shape.rows, want[slot].data());
    }
    uint32_t non_finite = 0;
    for (float v : scores) non_finite += std::isfinite(v) ? 0 : 1;
    if (add_to_total) total += non_finite;
    ASSERT_EQ(Published(), publish ? non_finite : 12345u) << replay;
    ASSERT_EQ(Total(), total) << replay;
  }
  for (int slot = 0; slot < 2; ++slot) {
    const ProbeOutcomeCounts expected = HostCounts(layout, want[slot]);
    ExpectDeviceCounts(expected, slots[slot], slot == 0 ? "slot 0" : "slot 1");
    EXPECT_GT(expected.rows(0), 0u);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(d_scores);
  for (auto* slot : slots) cudaFree(slot);
  DestroyProbeOutcomeTables(&tables);
}

// A tap's window of padded batches: of each group of 8 rows only the first counts[g] (clamped)
// are counted, in the outcomes and the non-finite count; every row is still copied.
TEST_F(CountProbeOutcomesTest, GroupCountsCountOnlyTheRealRowsOfEachGroup) {
  const Shape s{64, 64, 5, 20, 5};
  const int group_rows = 8;
  const std::vector<int32_t> counts = {8, 3, 0, 5, 8, -1, 9, 1};
  const std::vector<float> bounds = Bounds(s.bounds);
  const std::vector<float> thresholds = Thresholds(s.probes);
  const std::vector<float> scores = Scores(s, 99, bounds);
  const ProbeOutcomeLayout layout{s.probes, s.bounds};
  ProbeOutcomeTables tables;
  ASSERT_CUDA(CreateProbeOutcomeTables(thresholds.data(), bounds.data(), layout, &tables));
  unsigned long long* counters = nullptr;
  ASSERT_CUDA(CreateProbeOutcomeCounters(layout, stream_, &counters));
  float* d_scores = nullptr;
  int32_t* d_counts = nullptr;
  ASSERT_CUDA(cudaMalloc(&d_scores, sizeof(float) * scores.size()));
  ASSERT_CUDA(cudaMalloc(&d_counts, sizeof(int32_t) * counts.size()));
  ASSERT_CUDA(
      cudaMemcpy(d_scores, scores.data(), sizeof(float) * scores.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(
      cudaMemcpy(d_counts, counts.data(), sizeof(int32_t) * counts.size(), cudaMemcpyHostToDevice));
  float* copy = nullptr;
  float* copy_device = nullptr;
  ASSERT_CUDA(cudaHostAlloc(&copy, sizeof(float) * s.rows * s.probes, cudaHostAllocMapped));
  ASSERT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&copy_device), copy, 0));
  ProbeOutcomeDescriptor d;
  d.scores = d_scores;
  d.scores_row_stride = s.stride;
  d.copy_to = copy_device;
  d.copy_row_stride = s.probes;
  d.counters = counters;
  d.group_counts = d_counts;
  d.num_rows = s.rows;
  d.add_to_total = 1;
  d.publish_count = 1;
  d.group_rows = group_rows;
  ASSERT_CUDA(cudaMemcpy(descriptor_, &d, sizeof(d), cudaMemcpyHostToDevice));
  const CountProbeOutcomesParams p = Params(tables, s);
  ASSERT_CUDA(LaunchCountProbeOutcomes(p, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));

  std::vector<float> counted;  // the real rows, in order
  for (int r = 0; r < s.rows; ++r) {
    if (r % group_rows < counts[r / group_rows]) {
      counted.insert(counted.end(), scores.begin() + r * s.stride,
                     scores.begin() + (r + 1) * s.stride);
    }
  }
  const int real = static_cast<int>(counted.size()) / s.stride;
  ASSERT_EQ(real, 8 + 3 + 0 + 5 + 8 + 0 + 8 + 1);
  std::vector<std::atomic<uint64_t>> host(static_cast<size_t>(layout.SlotWords()));
  const ProbeOutcomeCpuParams cpu{counted.data(), s.stride, thresholds.data(), bounds.data(),
                                  layout};
  CountProbeOutcomesCpu(cpu, 0, real, host.data());
  ExpectDeviceCounts(HostCounts(layout, host), counters, "group counts");
  uint32_t non_finite = 0;
  for (int i = 0; i < real; ++i) {
    for (int c = 0; c < s.probes; ++c)
      non_finite += std::isfinite(counted[i * s.stride + c]) ? 0 : 1;
  }
  EXPECT_EQ(Published(), non_finite);
  EXPECT_EQ(Total(), non_finite);
  for (int r = 0; r < s.rows; ++r) {
    for (int c = 0; c < s.probes; ++c) {
      ASSERT_EQ(Bits(copy[r * s.probes + c]), Bits(scores[r * s.stride + c])) << r;
    }
  }
  cudaFree(d_scores);
  cudaFree(d_counts);
  cudaFreeHost(copy);
  cudaFree(counters);
  DestroyProbeOutcomeTables(&tables);
}

// Writes `n` scores from `from` to `to` after spinning ~`ns` nanoseconds: a scoring kernel whose
// last block finishes late. Grid: any.
__global__ void WriteScoresLate(const float* from, float* to, int n, int64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < static_cast<uint64_t>(ns));
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    to[i] = from[i];
  }
}

// Launched as a programmatic dependent of the kernel that writes the scores (as the server's graph
// does), eagerly and captured: the count still reads only what that kernel wrote.
TEST_F(CountProbeOutcomesTest, AProgrammaticCountWaitsForTheScores) {
  const Shape s{2000, 2048, 6, 20, 6};
  const std::vector<float> bounds = Bounds(s.bounds);
  const std::vector<float> thresholds = Thresholds(s.probes);
  const std::vector<float> scores = Scores(s, 77, bounds);
  const ProbeOutcomeLayout layout{s.probes, s.bounds};
  ProbeOutcomeTables tables;
  ASSERT_CUDA(CreateProbeOutcomeTables(thresholds.data(), bounds.data(), layout, &tables));
  unsigned long long* counters = nullptr;
  ASSERT_CUDA(CreateProbeOutcomeCounters(layout, stream_, &counters));
  float *source = nullptr, *d_scores = nullptr;
  ASSERT_CUDA(cudaMalloc(&source, sizeof(float) * scores.size()));
  ASSERT_CUDA(cudaMalloc(&d_scores, sizeof(float) * scores.size()));
  ASSERT_CUDA(
      cudaMemcpy(source, scores.data(), sizeof(float) * scores.size(), cudaMemcpyHostToDevice));
  ProbeOutcomeDescriptor d;
  d.scores = d_scores;
  d.scores_row_stride = s.stride;
  d.counters = counters;
  d.num_rows = s.rows;
  ASSERT_CUDA(cudaMemcpy(descriptor_, &d, sizeof(d), cudaMemcpyHostToDevice));
  const CountProbeOutcomesParams p = Params(tables, s);
  std::printf("programmatic launches here: %s\n", CountCanFollowProgrammatically() ? "yes" : "no");
  const int n = static_cast<int>(scores.size());
  auto enqueue = [&]() {
    // Poisoned first: a count that ran ahead of the write would see NaN everywhere.
    EXPECT_EQ(cudaMemsetAsync(d_scores, 0xff, sizeof(float) * n, stream_), cudaSuccess);
    WriteScoresLate<<<8, 128, 0, stream_>>>(source, d_scores, n, 200000);
    EXPECT_EQ(LaunchCountProbeOutcomes(p, stream_, OutcomeLaunch::kProgrammatic), cudaSuccess);
  };
  enqueue();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  enqueue();
  ASSERT_CUDA(cudaStreamEndCapture(stream_, &graph));
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) ASSERT_CUDA(cudaGraphLaunch(exec, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));

  std::vector<std::atomic<uint64_t>> host(static_cast<size_t>(layout.SlotWords()));
  const ProbeOutcomeCpuParams cpu{scores.data(), s.stride, thresholds.data(), bounds.data(),
                                  layout};
  for (int i = 0; i < 4; ++i) CountProbeOutcomesCpu(cpu, 0, s.rows, host.data());
  ExpectDeviceCounts(HostCounts(layout, host), counters, "programmatic");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(source);
  cudaFree(d_scores);
  cudaFree(counters);
  DestroyProbeOutcomeTables(&tables);
}

TEST(CountProbeOutcomesValidation, OutOfRangeParamsAreRefused) {
  CountProbeOutcomesParams p;
  EXPECT_EQ(LaunchCountProbeOutcomes(p, nullptr), cudaErrorInvalidValue);
  float f = 0;
  uint32_t u[2] = {0, 0};
  ProbeOutcomeDescriptor d;
  p.descriptor = &d;
  p.thresholds = &f;
  p.bounds = &f;
  unsigned long long total = 0;
  p.scratch = u;
  p.non_finite_total = &total;
  p.request_non_finite = u;
  p.num_probes = 1;
  p.bucket = 1;
  p.num_bounds = kMaxScoreBounds + 1;
  EXPECT_EQ(LaunchCountProbeOutcomes(p, nullptr), cudaErrorInvalidValue);
  p.num_bounds = 1;
  p.bucket = 0;
  EXPECT_EQ(LaunchCountProbeOutcomes(p, nullptr), cudaErrorInvalidValue);
  ProbeOutcomeTables tables;
  EXPECT_EQ(CreateProbeOutcomeTables(nullptr, &f, ProbeOutcomeLayout{1, 1}, &tables),
            cudaErrorInvalidValue);
  unsigned long long* counters = nullptr;
  EXPECT_EQ(CreateProbeOutcomeCounters(ProbeOutcomeLayout{0, 1}, nullptr, &counters),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace probesidecar::kernels

int main(int argc, char** argv) { return probesidecar::kernels::gpu_test::RunGpuTests(argc, argv); }
