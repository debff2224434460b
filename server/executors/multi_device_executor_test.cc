// The multi-device executor without a GPU: fake per-device executors record what reaches them.
// A job runs on its device's executor and never another's; one that names no device goes to the
// device with the fewest of its requests in flight; a device that is not served is refused with
// INVALID_ARGUMENT; a probe set is placed on every device (a failure refuses it); the fatal
// handler fires once, naming the device; per-device reports come back in device order.
#include "server/executors/multi_device_executor.h"

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "gtest/gtest.h"
#include "server/executors/test_executor.h"

namespace probesidecar::server {
namespace {

// Answers every request at once (or holds it, with `hold`), counting them; Place places a marker
// per device.
class FakeDeviceExecutor final : public TestExecutor {
 public:
  struct Marker final : ProbeSetPlacement {
    explicit Marker(int d) : device(d) {}
    int device;
  };
  explicit FakeDeviceExecutor(int device)
      : TestExecutor({"cuda", "fake GPU", {device}, "9.0", {}}), device_(device) {}
  ExecutorStats ReadStats(const StatsRead& read) override {
    reads.push_back(read.outcome_copy);
    ExecutorStats stats;
    stats.queued = static_cast<uint64_t>(held.size());
    stats.device_memory_bytes = 1000 + device_;
    stats.gpu_requests = scored;
    stats.mps = device_ == 3;
    stats.dropped.expired = 1;
    stats.graph_cache.hits = 10 * device_;
    DeviceReport& r = stats.devices.emplace_back();
    r.device = device_;
    r.name = info_.device_name;
    r.memory_bytes = stats.device_memory_bytes;
    r.queued = stats.queued;
    r.failure = failure;
    return stats;
  }
  absl::Status Place(ProbeSet& set) override {
    if (refuse_sets) return absl::ResourceExhaustedError("out of device memory");
    set.placements[device_] = std::make_shared<Marker>(device_);
    return absl::OkStatus();
  }
  void Submit(ExecutorTask task) override {
    if (auto* score = std::get_if<ScoreTask>(&task)) {
      ++scored;
      if (hold) {
        held.push_back(std::move(*score));
        return;
      }
      std::move(score->done)(std::move(score->job), absl::OkStatus(), ScoreTimings{});
      return;
    }
    ++verified;
    auto& verify = std::get<VerifyTask>(task);
    std::move(verify.done)(std::move(verify.job), absl::OkStatus(), VerifyResult{});
  }
  // Answers the held requests.
  void Release() {
    for (ScoreTask& t : held) std::move(t.done)(std::move(t.job), absl::OkStatus(), {});
    held.clear();
  }

  const int device_;
  int scored = 0;
  int verified = 0;
  bool hold = false;
  std::vector<ScoreTask> held;
  bool refuse_sets = false;
  std::string failure;
  std::vector<OutcomeCopy> reads;
};

struct TwoDevices {
  TwoDevices() {
    std::vector<std::unique_ptr<Executor>> executors;
    auto a = std::make_unique<FakeDeviceExecutor>(0);
    auto b = std::make_unique<FakeDeviceExecutor>(3);
    d0 = a.get();
    d3 = b.get();
    executors.push_back(std::move(a));
    executors.push_back(std::move(b));
    executor = std::make_unique<MultiDeviceExecutor>(std::vector<int>{0, 3}, std::move(executors));
  }
  absl::Status Score(std::optional<int> device) {
    auto job = std::make_unique<ScoreJob>();
    job->device = device;
    // Shared with the callback, which a holding device calls later.
    auto answer = std::make_shared<absl::Status>(absl::UnknownError("not answered"));
    executor->Score(std::move(job), [answer](std::unique_ptr<ScoreJob> back, absl::Status s,
                                             const ScoreTimings&) {
      EXPECT_NE(back, nullptr);
      *answer = s;
    });
    return *answer;
  }
  FakeDeviceExecutor* d0;
  FakeDeviceExecutor* d3;
  std::unique_ptr<MultiDeviceExecutor> executor;
};

TEST(MultiDeviceExecutorTest, AJobRunsOnTheDeviceOfItsBuffers) {
  TwoDevices t;
  EXPECT_EQ(t.executor->info().devices, (std::vector<int>{0, 3}));
  ASSERT_TRUE(t.Score(3).ok());
  ASSERT_TRUE(t.Score(3).ok());
  ASSERT_TRUE(t.Score(0).ok());
  EXPECT_EQ(t.d0->scored, 1);
  EXPECT_EQ(t.d3->scored, 2);
  auto verify = std::make_unique<VerifyJob>();
  verify->device = 3;
  t.executor->Verify(std::move(verify), [](std::unique_ptr<VerifyJob>, absl::Status s,
                                           const VerifyResult&) { EXPECT_TRUE(s.ok()) << s; });
  EXPECT_EQ(t.d3->verified, 1);
  EXPECT_EQ(t.d0->verified, 0);
}

TEST(MultiDeviceExecutorTest, AJobWithoutADeviceGoesWhereFewestAreInFlight) {
  TwoDevices t;
  t.d0->hold = true;
  t.d3->hold = true;
  // A held request is not answered yet (its status stays the helper's "not answered").
  auto held = [&t] { return t.Score(std::nullopt).code() == absl::StatusCode::kUnknown; };
  EXPECT_TRUE(held());  // both idle: the first device
  EXPECT_TRUE(held());  // device 0 has one in flight: device 3
  EXPECT_TRUE(held());  // one each: the first again
  EXPECT_EQ(t.d0->held.size(), 2u);
  EXPECT_EQ(t.d3->held.size(), 1u);
  t.d0->Release();  // answered: no longer in flight
  EXPECT_TRUE(held());
  EXPECT_TRUE(held());
  EXPECT_EQ(t.d0->held.size(), 2u);
  EXPECT_EQ(t.d3->held.size(), 1u);
  EXPECT_EQ(t.executor->stats().queued, 3u);  // summed
  t.d0->Release();
  t.d3->Release();
}

TEST(MultiDeviceExecutorTest, AnOutcomeCopyIsAskedOfEveryDeviceBeforeOneIsWaitedFor) {
  TwoDevices t;
  t.executor->ReadStats({OutcomeCopy::kWait, absl::Now()});
  EXPECT_EQ(t.d0->reads, (std::vector<OutcomeCopy>{OutcomeCopy::kAsk, OutcomeCopy::kWait}));
  EXPECT_EQ(t.d3->reads, (std::vector<OutcomeCopy>{OutcomeCopy::kAsk, OutcomeCopy::kWait}));
}

TEST(MultiDeviceExecutorTest, ADeviceThatIsNotServedIsRefused) {
  TwoDevices t;
  const absl::Status s = t.Score(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("CUDA device 1, which this server does not serve"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(t.d0->scored + t.d3->scored, 0);
}

TEST(MultiDeviceExecutorTest, AProbeSetIsPlacedOnEveryDeviceOrRefused) {
  TwoDevices t;
  ProbeSet set;
  ASSERT_TRUE(t.executor->Place(set).ok());
  ASSERT_EQ(set.placements.size(), 2u);
  ASSERT_NE(set.PlacementAs<FakeDeviceExecutor::Marker>(3), nullptr);
  EXPECT_EQ(set.PlacementAs<FakeDeviceExecutor::Marker>(3)->device, 3);
  t.d3->refuse_sets = true;
  ProbeSet refused;
  const absl::Status s = t.executor->Place(refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("CUDA device 3: out of device memory"), absl::string_view::npos) << s;
  EXPECT_TRUE(refused.placements.empty());  // device 0's copy went with the refusal
}

TEST(MultiDeviceExecutorTest, TheFirstFailedDeviceStopsTheServerOnceAndIsNamed) {
  TwoDevices t;
  std::vector<std::string> reasons;
  t.executor->SetFatalHandler(
      [&](const absl::Status& why) { reasons.push_back(std::string(why.message())); });
  t.d3->failure = "the GPU's CUDA context is lost";
  t.d3->ReportFatal(absl::UnavailableError("the GPU's CUDA context is lost"));
  t.d0->ReportFatal(absl::UnavailableError("later"));
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0], "CUDA device 3: the GPU's CUDA context is lost");
  const ExecutorStats stats = t.executor->stats();
  const std::vector<DeviceReport>& reports = stats.devices;
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].device, 0);
  EXPECT_TRUE(reports[0].failure.empty());
  EXPECT_EQ(reports[1].device, 3);
  EXPECT_EQ(reports[1].failure, "the GPU's CUDA context is lost");
  // The totals are the devices' summed (mps: any of them).
  EXPECT_EQ(stats.device_memory_bytes, 2003u);
  EXPECT_EQ(stats.dropped.expired, 2u);
  EXPECT_EQ(stats.graph_cache.hits, 30u);
  EXPECT_TRUE(stats.mps);
  EXPECT_EQ(t.executor->info().device_name, "fake GPU (x2)");
  EXPECT_EQ(t.executor->info().compute_capability, "9.0");
}

}  // namespace
}  // namespace probesidecar::server
