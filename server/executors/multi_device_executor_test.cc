// The multi-device executor without a GPU: fake per-device executors record what reaches them.
// A job runs on its device's executor and never another's; one that names no device goes to the
// device with the fewest queued requests; a device that is not served is refused with
// INVALID_ARGUMENT; a probe set is placed on every device (a failure refuses it); the fatal
// handler fires once, naming the device; per-device reports come back in device order.
#include "server/executors/multi_device_executor.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace probesidecar::server {
namespace {

// Answers every request at once, counting them; PrepareProbeSet places a marker per device.
class FakeDeviceExecutor final : public Executor {
 public:
  explicit FakeDeviceExecutor(int device) : device_(device) {}
  const char* backend() const override { return "cuda"; }
  std::string device_name() const override { return "fake GPU"; }
  std::vector<int> devices() const override { return {device_}; }
  ExecutorStats stats() const override {
    ExecutorStats stats;
    stats.queued = queued();
    stats.device_memory_bytes = 1000 + device_;
    stats.gpu_requests = scored;
    stats.mps = device_ == 3;
    stats.dropped.expired = 1;
    stats.graph_cache.hits = 10 * device_;
    DeviceReport& r = stats.devices.emplace_back();
    r.device = device_;
    r.name = device_name();
    r.memory_bytes = stats.device_memory_bytes;
    r.queued = queued_;
    r.failure = failure;
    return stats;
  }
  absl::Status PrepareProbeSet(ProbeSet& set) override {
    if (refuse_sets) return absl::ResourceExhaustedError("out of device memory");
    set.device_weights[device_] = std::make_shared<int>(device_);
    return absl::OkStatus();
  }
  void Score(std::unique_ptr<ScoreJob> job, ScoreDone done) override {
    ++scored;
    std::move(done)(std::move(job), absl::OkStatus(), ScoreTimings{});
  }
  void Verify(std::unique_ptr<VerifyJob> job, VerifyDone done) override {
    ++verified;
    std::move(done)(std::move(job), absl::OkStatus(), VerifyOutcome{});
  }
  uint64_t queued() const override { return queued_; }
  void SetFatalHandler(FatalHandler handler) override { fatal = std::move(handler); }
  void Shutdown() override {}

  const int device_;
  int scored = 0;
  int verified = 0;
  uint64_t queued_ = 0;
  bool refuse_sets = false;
  std::string failure;
  FatalHandler fatal;
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
    absl::Status answer = absl::UnknownError("not answered");
    executor->Score(std::move(job),
                    [&](std::unique_ptr<ScoreJob> back, absl::Status s, const ScoreTimings&) {
                      EXPECT_NE(back, nullptr);
                      answer = s;
                    });
    return answer;
  }
  FakeDeviceExecutor* d0;
  FakeDeviceExecutor* d3;
  std::unique_ptr<MultiDeviceExecutor> executor;
};

TEST(MultiDeviceExecutorTest, AJobRunsOnTheDeviceOfItsBuffers) {
  TwoDevices t;
  EXPECT_EQ(t.executor->devices(), (std::vector<int>{0, 3}));
  ASSERT_TRUE(t.Score(3).ok());
  ASSERT_TRUE(t.Score(3).ok());
  ASSERT_TRUE(t.Score(0).ok());
  EXPECT_EQ(t.d0->scored, 1);
  EXPECT_EQ(t.d3->scored, 2);
  auto verify = std::make_unique<VerifyJob>();
  verify->device = 3;
  t.executor->Verify(std::move(verify), [](std::unique_ptr<VerifyJob>, absl::Status s,
                                           const VerifyOutcome&) { EXPECT_TRUE(s.ok()) << s; });
  EXPECT_EQ(t.d3->verified, 1);
  EXPECT_EQ(t.d0->verified, 0);
}

TEST(MultiDeviceExecutorTest, AJobWithoutADeviceGoesWhereFewestWait) {
  TwoDevices t;
  t.d0->queued_ = 5;
  t.d3->queued_ = 1;
  ASSERT_TRUE(t.Score(std::nullopt).ok());
  EXPECT_EQ(t.d3->scored, 1);
  t.d0->queued_ = 0;
  ASSERT_TRUE(t.Score(std::nullopt).ok());
  EXPECT_EQ(t.d0->scored, 1);
  EXPECT_EQ(t.executor->stats().queued, 1u);  // summed
  EXPECT_EQ(t.executor->queued(), 1u);
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
  ASSERT_TRUE(t.executor->PrepareProbeSet(set).ok());
  ASSERT_EQ(set.device_weights.size(), 2u);
  EXPECT_EQ(*static_cast<const int*>(set.device_weights.at(3).get()), 3);
  t.d3->refuse_sets = true;
  ProbeSet refused;
  const absl::Status s = t.executor->PrepareProbeSet(refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("CUDA device 3: out of device memory"), absl::string_view::npos) << s;
  EXPECT_TRUE(refused.device_weights.empty());  // device 0's copy went with the refusal
}

TEST(MultiDeviceExecutorTest, TheFirstFailedDeviceStopsTheServerOnceAndIsNamed) {
  TwoDevices t;
  std::vector<std::string> reasons;
  t.executor->SetFatalHandler(
      [&](const absl::Status& why) { reasons.push_back(std::string(why.message())); });
  t.d3->failure = "the GPU's CUDA context is lost";
  t.d3->fatal(absl::UnavailableError("the GPU's CUDA context is lost"));
  t.d0->fatal(absl::UnavailableError("later"));
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
  EXPECT_EQ(t.executor->device_name(), "fake GPU (x2)");
}

}  // namespace
}  // namespace probesidecar::server
