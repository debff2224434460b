// The C++ CUDA tap (client/cpp/tap.h) against the real probe-sidecar binary on the GPU, across two
// processes: random rows written on the GPU (eagerly, late behind a busy stream, and inside a
// captured CUDA graph with a device-resident row count) into the tap's own ring, one Score per
// window ordered by CUDA IPC events (or sent once the writes have landed), every written row's
// scores checked against float64 of the same rows, on the host and in the device ring; misuse
// refused; a refused window delivered as an error; the ring unregistered on close.
//
// GPU only: exits 77 (skipped) without a CUDA device. PROBE_SIDECAR_BIN names the server.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/session.h"
#include "client/cpp/tap.h"
#include "common/dtype.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/cpp/sidecar_process.h"
#include "tests/cpp/tap_gpu_test_kernels.h"
#include "kernels/blocks/gpu_test_main.h"

namespace probesidecar {
namespace {

using client::Client;
using client::Tap;
using client::TapOptions;
using client::TapRows;
using client::TapWindow;

#define ASSERT_CUDA(call)                                                          \
  do {                                                                             \
    const cudaError_t error_ = (call);                                             \
    ASSERT_EQ(error_, cudaSuccess) << #call << ": " << cudaGetErrorString(error_); \
  } while (0)

constexpr int32_t kHidden = 2048, kProbes = 16;
constexpr double kTolerance = 1e-3;  // relative L2 error of a step's fp32 scores vs float64

// The probe set: float32 weights, thresholds 0 on odd probes (none on even ones).
struct ProbeSet {
  std::vector<float> weight;  // [P, H]
  std::vector<float> bias;    // [P]
};

const ProbeSet& Probes() {
  static const ProbeSet* set = [] {
    auto* s = new ProbeSet;
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < int64_t{kProbes} * kHidden; ++i) {
      s->weight.push_back(normal(rng) / std::sqrt(static_cast<float>(kHidden)));
    }
    for (int p = 0; p < kProbes; ++p) s->bias.push_back(0.1f * normal(rng));
    return s;
  }();
  return *set;
}

std::string ProbeFile() {
  const ProbeSet& s = Probes();
  std::string thresholds = "[";
  for (int p = 0; p < kProbes; ++p)
    thresholds += (p ? ", " : "") + std::string(p % 2 ? "0" : "null");
  thresholds += "]";
  return common::WriteSafetensors(
      {{"weight",
        "F32",
        {kProbes, kHidden},
        std::string(reinterpret_cast<const char*>(s.weight.data()), s.weight.size() * 4)},
       {"bias",
        "F32",
        {kProbes},
        std::string(reinterpret_cast<const char*>(s.bias.data()), s.bias.size() * 4)}},
      {{"activation", "none"}, {"thresholds", thresholds}});
}

// Random bf16 rows, [n, H] each, as their bits.
std::vector<uint16_t> RandomRows(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> rows(n * kHidden);
  for (uint16_t& v : rows) v = common::FloatToBf16(normal(rng));
  return rows;
}

// Every written row of every window against float64 of its rows; fired flags against the
// delivered scores and the thresholds. `rows_of(t)` is step t's bf16 rows [>= n, H], `batch_of(t)`
// its row count. Returns the steps checked.
int CheckWindows(const std::vector<TapWindow>& windows,
                 const std::function<const uint16_t*(int64_t)>& rows_of,
                 const std::function<int32_t(int64_t)>& batch_of) {
  const ProbeSet& s = Probes();
  int steps = 0;
  for (const TapWindow& w : windows) {
    EXPECT_TRUE(w.error.ok()) << "window " << w.index << ": " << w.error;
    if (!w.error.ok()) continue;
    EXPECT_EQ(w.num_probes, kProbes);
    for (int32_t i = 0; i < w.steps(); ++i) {
      const int64_t t = w.first_step + i;
      const int32_t n = batch_of(t);
      EXPECT_EQ(w.num_rows[i], n) << "step " << t;
      const uint16_t* x = rows_of(t);
      double num = 0, den = 0;
      for (int32_t r = 0; r < n; ++r) {
        for (int p = 0; p < kProbes; ++p) {
          double want = s.bias[p];
          for (int h = 0; h < kHidden; ++h) {
            want += double{common::Bf16ToFloat(x[r * kHidden + h])} *
                    double{s.weight[int64_t{p} * kHidden + h]};
          }
          const float got = w.Scores(i, r)[p];
          num += (got - want) * (got - want);
          den += want * want;
          EXPECT_EQ(w.Fired(i, r, p), p % 2 == 1 && got >= 0.0f) << "step " << t << " row " << r;
        }
      }
      const double rel = std::sqrt(num / den);
      EXPECT_LE(rel, kTolerance) << "step " << t << ": relative error " << rel;
      ++steps;
    }
  }
  return steps;
}

std::vector<TapWindow> Drain(Tap& tap) {
  std::vector<TapWindow> windows;
  while (std::optional<TapWindow> w = tap.Get(0)) windows.push_back(std::move(*w));
  return windows;
}

// One server for the suite (its start-up is the slow part), one session and stream per test.
class TapGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    sidecar_ = new testing::SidecarProcess({"--backend=cuda", "--warmup-rows=none"});
    std::string error;
    if (!sidecar_->Start(&error)) {
      start_error_ = new std::string(error);
      return;
    }
    Client c(sidecar_->uds_target());
    absl::StatusOr<v1::ProbeSetInfo> loaded =
        c.LoadProbeSetFromBytes("tap16", ProbeFile(), {true, v1::PRECISION_EXACT});
    if (!loaded.ok()) start_error_ = new std::string(loaded.status().ToString());
  }
  static void TearDownTestSuite() {
    delete sidecar_;
    sidecar_ = nullptr;
  }
  void SetUp() override {
    ASSERT_EQ(start_error_, nullptr) << *start_error_;
    client_ = std::make_unique<Client>(sidecar_->uds_target());
    absl::StatusOr<std::unique_ptr<client::Session>> session = client::Session::Open(*client_);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    session_.reset();
    client_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (sidecar_ != nullptr) {
      EXPECT_TRUE(sidecar_->Running()) << sidecar_->Log();
    }
  }

  std::unique_ptr<Tap> MakeTap(int32_t max_batch, int32_t window, bool host_results = true,
                               client::TapSubmit submit = client::TapSubmit::kAuto) {
    TapOptions options;
    options.max_batch = max_batch;
    options.window = window;
    options.stream = stream_;
    options.host_results = host_results;
    options.submit = submit;
    absl::StatusOr<std::unique_ptr<Tap>> tap =
        Tap::Create(*client_, session_->id(), "tap16", options);
    EXPECT_TRUE(tap.ok()) << tap.status();
    return tap.ok() ? *std::move(tap) : nullptr;
  }

  // Writes `steps` full batches of random rows (seeded by `seed`) through `tap`, each behind
  // `delay_ns` of other work on the stream (0: none), closes it and checks every window's scores.
  void WriteFullBatchesAndCheck(Tap& tap, uint32_t seed, int32_t steps, int32_t max_batch,
                                int64_t delay_ns) {
    std::mt19937 rng(seed);
    const std::vector<uint16_t> all = RandomRows(rng, int64_t{steps} * max_batch);
    void* rows = nullptr;
    ASSERT_CUDA(cudaMalloc(&rows, all.size() * 2));
    ASSERT_CUDA(cudaMemcpy(rows, all.data(), all.size() * 2, cudaMemcpyHostToDevice));
    for (int t = 0; t < steps; ++t) {
      if (delay_ns > 0) ASSERT_CUDA(testing::LaunchGpuDelay(delay_ns, stream_));
      ASSERT_TRUE(
          tap.Write(static_cast<uint8_t*>(rows) + int64_t{t} * max_batch * kHidden * 2, max_batch)
              .ok());
      absl::Status s = tap.Step();
      ASSERT_TRUE(s.ok()) << s;
    }
    ASSERT_TRUE(tap.Close().ok());
    EXPECT_EQ(CheckWindows(
                  Drain(tap), [&](int64_t t) { return all.data() + t * max_batch * kHidden; },
                  [&](int64_t) { return max_batch; }),
              steps);
    ASSERT_CUDA(cudaFree(rows));
  }

  size_t Buffers() {
    absl::StatusOr<std::vector<v1::BufferInfo>> buffers = client_->ListBuffers();
    EXPECT_TRUE(buffers.ok()) << buffers.status();
    return buffers.ok() ? buffers->size() : 0;
  }

  static testing::SidecarProcess* sidecar_;
  static std::string* start_error_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<client::Session> session_;
  cudaStream_t stream_ = nullptr;
};

testing::SidecarProcess* TapGpuTest::sidecar_ = nullptr;
std::string* TapGpuTest::start_error_ = nullptr;

// Eager writes behind a busy stream (the sidecar must wait on the GPU for them), batches that
// vary step by step, five full windows and a partial one.
TEST_F(TapGpuTest, EagerWritesEveryWindowAgainstFloat64) {
  const int32_t max_batch = 8, window = 4, steps = 23;
  const int32_t batches[] = {8, 8, 3, 8, 1, 5};
  std::unique_ptr<Tap> tap = MakeTap(max_batch, window);
  ASSERT_NE(tap, nullptr);
  std::mt19937 rng(1);
  std::vector<std::vector<uint16_t>> history;
  // A staging region per step (the stream orders each copy before its write; separate regions make
  // a write that read another step's rows show).
  void* staging = nullptr;
  ASSERT_CUDA(cudaMalloc(&staging, int64_t{steps} * max_batch * kHidden * 2));
  for (int t = 0; t < steps; ++t) {
    const int32_t n = batches[t % 6];
    history.push_back(RandomRows(rng, n));
    void* rows = static_cast<uint8_t*>(staging) + int64_t{t} * max_batch * kHidden * 2;
    ASSERT_CUDA(testing::LaunchGpuDelay(200'000, stream_));  // the rows land late
    ASSERT_CUDA(cudaMemcpyAsync(rows, history.back().data(), history.back().size() * 2,
                                cudaMemcpyHostToDevice, stream_));
    ASSERT_TRUE(tap->Write(rows, n).ok());
    absl::Status s = tap->Step();
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_TRUE(tap->Close().ok());
  const std::vector<TapWindow> windows = Drain(*tap);
  ASSERT_EQ(windows.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(windows[i].index, i);
    EXPECT_EQ(windows[i].steps(), i < 5 ? 4 : 3);
    EXPECT_EQ(windows[i].non_finite, 0);
    ASSERT_TRUE(windows[i].device_latency_s.has_value());
    EXPECT_GE(*windows[i].device_latency_s, 0.0);
    ASSERT_TRUE(windows[i].host_memory_latency_s.has_value());
    EXPECT_GE(*windows[i].host_memory_latency_s, *windows[i].device_latency_s);
  }
  EXPECT_EQ(CheckWindows(
                windows, [&](int64_t t) { return history[t].data(); },
                [&](int64_t t) { return batches[t % 6]; }),
            steps);
  ASSERT_CUDA(cudaFree(staging));
}

// Each window sent from the tap's submit thread once its writes have landed (late, behind a busy
// stream): the same scores.
TEST_F(TapGpuTest, HostSubmittedWindowsScoreTheSame) {
  const int32_t max_batch = 4, window = 4, steps = 16;
  std::unique_ptr<Tap> tap = MakeTap(max_batch, window, true, client::TapSubmit::kHost);
  ASSERT_NE(tap, nullptr);
  WriteFullBatchesAndCheck(*tap, 5, steps, max_batch, /*delay_ns=*/500'000);
}

// The write inside a captured CUDA graph: each replay plays a step (its rows and row count picked
// on the GPU by a device-side step counter), writes the next slot, and the host only calls
// Step(). The last window's scores also stay in the device ring.
TEST_F(TapGpuTest, GraphCapturedWritesWithDeviceRowCounts) {
  const int32_t max_batch = 16, window = 8, steps = 40;
  std::unique_ptr<Tap> tap = MakeTap(max_batch, window);
  ASSERT_NE(tap, nullptr);
  auto batch_of = [&](int64_t t) { return max_batch - static_cast<int32_t>(t % 5) * 3; };
  std::mt19937 rng(2);
  const std::vector<uint16_t> noise = RandomRows(rng, int64_t{steps} * max_batch);
  std::vector<int32_t> counts(steps);
  for (int t = 0; t < steps; ++t) counts[t] = batch_of(t);
  void *noise_d = nullptr, *state = nullptr;
  int32_t *counts_d = nullptr, *num_rows = nullptr;
  int64_t* step = nullptr;
  const int64_t step_bytes = int64_t{max_batch} * kHidden * 2;
  ASSERT_CUDA(cudaMalloc(&noise_d, noise.size() * 2));
  ASSERT_CUDA(cudaMalloc(&state, step_bytes));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&counts_d), steps * 4));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&num_rows), 4));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&step), 8));
  ASSERT_CUDA(cudaMemcpy(noise_d, noise.data(), noise.size() * 2, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(counts_d, counts.data(), steps * 4, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(step, 0, 8));

  // Once eagerly, so that its kernels are loaded before the capture; then the counter from 0.
  ASSERT_CUDA(
      testing::LaunchPlayStep(noise_d, counts_d, step, state, num_rows, step_bytes, stream_));
  ASSERT_CUDA(cudaMemsetAsync(step, 0, 8, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  // Thread-local capture: the tap's threads call CUDA meanwhile.
  ASSERT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  ASSERT_CUDA(
      testing::LaunchPlayStep(noise_d, counts_d, step, state, num_rows, step_bytes, stream_));
  TapRows rows{state, max_batch};
  rows.device_num_rows32 = num_rows;
  const absl::Status captured = tap->Write(rows);
  ASSERT_CUDA(cudaStreamEndCapture(stream_, &graph));
  ASSERT_TRUE(captured.ok()) << captured;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int t = 0; t < steps; ++t) {
    ASSERT_CUDA(cudaGraphLaunch(exec, stream_));
    absl::Status s = tap->Step();
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_TRUE(tap->Flush().ok());
  ASSERT_TRUE(tap->WaitDelivered().ok());
  const std::vector<TapWindow> windows = Drain(*tap);
  ASSERT_EQ(windows.size(), 5u);
  EXPECT_EQ(
      CheckWindows(
          windows, [&](int64_t t) { return noise.data() + t * max_batch * kHidden; }, batch_of),
      steps);
  // The last window in the device ring, read on the stream after the sidecar's writes.
  const TapWindow& last = windows.back();
  absl::StatusOr<const float*> device = tap->DeviceScores(last.index, stream_);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<float> copy(last.scores.size());
  ASSERT_CUDA(
      cudaMemcpyAsync(copy.data(), *device, copy.size() * 4, cudaMemcpyDeviceToHost, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  for (int32_t i = 0; i < last.steps(); ++i) {
    for (int32_t r = 0; r < last.num_rows[i]; ++r) {
      for (int p = 0; p < kProbes; ++p) {
        const int64_t at = (int64_t{i} * max_batch + r) * kProbes + p;
        EXPECT_EQ(copy[at], last.scores[at]) << i << "," << r << "," << p;
      }
    }
  }
  EXPECT_EQ(tap->DeviceScores(last.index - 2, stream_).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(tap->Close().ok());
  ASSERT_CUDA(cudaGraphExecDestroy(exec));
  ASSERT_CUDA(cudaGraphDestroy(graph));
  for (void* p : {noise_d, state, static_cast<void*>(counts_d), static_cast<void*>(num_rows),
                  static_cast<void*>(step)}) {
    ASSERT_CUDA(cudaFree(p));
  }
}

// Windows of one step and full batches: if the loop reused a half before the sidecar had read
// it, later rows would show up in earlier steps' scores.
TEST_F(TapGpuTest, AHalfIsNeverOverwrittenWhileTheSidecarReadsIt) {
  const int32_t max_batch = 64, steps = 30;
  std::unique_ptr<Tap> tap = MakeTap(max_batch, 1);
  ASSERT_NE(tap, nullptr);
  WriteFullBatchesAndCheck(*tap, 3, steps, max_batch, /*delay_ns=*/0);
}

TEST_F(TapGpuTest, ADeviceOnlyTapLeavesTheScoresInTheRing) {
  const int32_t max_batch = 4, window = 2;
  std::unique_ptr<Tap> tap = MakeTap(max_batch, window, /*host_results=*/false);
  ASSERT_NE(tap, nullptr);
  std::mt19937 rng(4);
  const std::vector<uint16_t> all = RandomRows(rng, 2 * max_batch);
  void* rows = nullptr;
  ASSERT_CUDA(cudaMalloc(&rows, all.size() * 2));
  ASSERT_CUDA(cudaMemcpy(rows, all.data(), all.size() * 2, cudaMemcpyHostToDevice));
  for (int t = 0; t < 2; ++t) {
    ASSERT_TRUE(
        tap->Write(static_cast<uint8_t*>(rows) + t * max_batch * kHidden * 2, max_batch).ok());
    ASSERT_TRUE(tap->Step().ok());
  }
  ASSERT_TRUE(tap->WaitDelivered().ok());
  EXPECT_FALSE(tap->Get(0).has_value());
  absl::StatusOr<const float*> device = tap->DeviceScores(0, stream_);
  ASSERT_TRUE(device.ok()) << device.status();
  TapWindow as_delivered;  // the device scores, checked as a delivered window would be
  as_delivered.max_batch = max_batch;
  as_delivered.num_probes = kProbes;
  as_delivered.num_rows = {max_batch, max_batch};
  as_delivered.scores.resize(2 * max_batch * kProbes);
  ASSERT_CUDA(cudaMemcpyAsync(as_delivered.scores.data(), *device, as_delivered.scores.size() * 4,
                              cudaMemcpyDeviceToHost, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  as_delivered.fired.resize(as_delivered.scores.size());
  for (size_t i = 0; i < as_delivered.scores.size(); ++i) {
    as_delivered.fired[i] = (i % kProbes) % 2 == 1 && as_delivered.scores[i] >= 0.0f;
  }
  EXPECT_EQ(CheckWindows(
                {as_delivered}, [&](int64_t t) { return all.data() + t * max_batch * kHidden; },
                [&](int64_t) { return max_batch; }),
            2);
  ASSERT_TRUE(tap->Close().ok());
  ASSERT_CUDA(cudaFree(rows));
}

TEST_F(TapGpuTest, MisuseIsRefusedClearlyAndCloseUnregistersTheRing) {
  TapOptions options;
  options.max_batch = 4;
  options.window = 4;
  options.stream = stream_;
  auto code_of = [&](const TapOptions& o, const std::string& set, uint64_t session) {
    return Tap::Create(*client_, session, set, o).status();
  };
  absl::Status s = code_of(options, "tap16", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(code_of(options, "no_such_set", session_->id()).code(), absl::StatusCode::kNotFound);
  TapOptions bad = options;
  bad.hidden_size = kHidden / 2;
  s = code_of(bad, "tap16", session_->id());
  EXPECT_NE(s.message().find("does not match probe set 'tap16'"), std::string::npos) << s;
  bad = options;
  bad.max_batch = bad.window = 1 << 12;
  s = code_of(bad, "tap16", session_->id());
  EXPECT_NE(s.message().find("--max-rows"), std::string::npos) << s;
  bad = options;
  bad.dtype = v1::DTYPE_INT32;
  EXPECT_EQ(code_of(bad, "tap16", session_->id()).code(), absl::StatusCode::kInvalidArgument);

  const size_t before = Buffers();
  std::unique_ptr<Tap> tap = MakeTap(4, 4);
  ASSERT_NE(tap, nullptr);
  EXPECT_EQ(Buffers(), before + 1);
  void* rows = nullptr;
  ASSERT_CUDA(cudaMalloc(&rows, 8 * kHidden * 2));
  s = tap->Write(rows, 5);
  EXPECT_NE(s.message().find("max_batch = 4"), std::string::npos) << s;
  s = tap->Write(static_cast<uint8_t*>(rows) + 1, 4);  // not on a bf16 boundary
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("aligned"), std::string::npos) << s;
  ASSERT_TRUE(tap->Close().ok());
  EXPECT_EQ(Buffers(), before) << "a closed tap leaves its ring registered";
  s = tap->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("closed"), std::string::npos) << s;
  ASSERT_CUDA(cudaFree(rows));
}

TEST_F(TapGpuTest, AWindowTheServerRefusesIsAnErrorNotStaleScores) {
  std::unique_ptr<Tap> tap = MakeTap(1, 1);
  ASSERT_NE(tap, nullptr);
  void* rows = nullptr;
  ASSERT_CUDA(cudaMalloc(&rows, kHidden * 2));
  ASSERT_CUDA(cudaMemset(rows, 0, kHidden * 2));
  ASSERT_TRUE(client_->UnloadProbeSet("tap16").ok());  // the next window names a set that is gone
  ASSERT_TRUE(tap->Write(rows, 1).ok());
  absl::Status first = tap->Step();
  ASSERT_TRUE(tap->WaitDelivered().ok());
  std::optional<TapWindow> window = tap->Get(0);
  ASSERT_TRUE(window.has_value());
  EXPECT_EQ(window->error.code(), absl::StatusCode::kNotFound) << window->error;
  EXPECT_TRUE(window->scores.empty());
  const absl::Status next = first.ok() ? tap->Flush() : first;
  EXPECT_EQ(next.code(), absl::StatusCode::kNotFound) << next;
  EXPECT_EQ(tap->stats().windows_failed, 1);
  ASSERT_TRUE(tap->Close().ok());
  ASSERT_TRUE(client_->LoadProbeSetFromBytes("tap16", ProbeFile(), {true, v1::PRECISION_EXACT}).ok());
  ASSERT_CUDA(cudaFree(rows));
}

}  // namespace
}  // namespace probesidecar

int main(int argc, char** argv) {
  return probesidecar::kernels::gpu_test::RunGpuTests(argc, argv);
}
