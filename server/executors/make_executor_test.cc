// The choice of backend without a GPU: fake CUDA devices, each usable or not. `auto` falls back to
// the CPU only when no device of --devices is usable; some usable and others not, or a device the
// build has no code for, stops the start whatever the backend; `cuda` never falls back.
#include "server/executors/make_executor.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/executors/test_executor.h"

namespace probesidecar::server {
namespace {

class FakeCudaExecutor final : public TestExecutor {
 public:
  explicit FakeCudaExecutor(int device) : TestExecutor({"cuda", "fake GPU", {device}, "", {}}) {}
};

// `count` devices seen; a device in `broken` fails to start with its status.
CudaExecutorFactory Devices(absl::StatusOr<int> count, std::map<int, absl::Status> broken = {}) {
  return {.device_count = [count] { return count; },
          .create = [broken](const Config& one) -> absl::StatusOr<std::unique_ptr<Executor>> {
            EXPECT_EQ(one.devices, std::vector<int>{one.device});
            EXPECT_FALSE(one.all_devices);
            if (auto it = broken.find(one.device); it != broken.end()) return it->second;
            return std::make_unique<FakeCudaExecutor>(one.device);
          }};
}

Config With(Backend backend, std::vector<int> devices, bool all = false) {
  Config config;
  config.backend = backend;
  config.devices = std::move(devices);
  config.all_devices = all;
  config.cpu_threads = 1;
  return config;
}

const absl::Status kMissing = absl::UnavailableError("cudaSetDevice: invalid device ordinal");

TEST(MakeExecutor, AutoServesEveryUsableDevice) {
  auto made = MakeExecutor(With(Backend::kAuto, {0, 1}), Devices(2));
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ((*made)->info().backend, "cuda");
  EXPECT_EQ((*made)->info().devices, (std::vector<int>{0, 1}));

  auto all = MakeExecutor(With(Backend::kAuto, {0}, /*all=*/true), Devices(3));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ((*all)->info().devices, (std::vector<int>{0, 1, 2}));
}

TEST(MakeExecutor, AutoFallsBackToTheCpuOnlyWhenNoDeviceIsUsable) {
  auto none_seen = MakeExecutor(With(Backend::kAuto, {0}, /*all=*/true),
                                Devices(absl::UnavailableError("no CUDA device")));
  ASSERT_TRUE(none_seen.ok()) << none_seen.status();
  EXPECT_EQ((*none_seen)->info().backend, "cpu");

  auto none_listed_seen =
      MakeExecutor(With(Backend::kAuto, {0, 1}), Devices(absl::UnavailableError("no CUDA device")));
  ASSERT_TRUE(none_listed_seen.ok()) << none_listed_seen.status();
  EXPECT_EQ((*none_listed_seen)->info().backend, "cpu");

  auto none_usable =
      MakeExecutor(With(Backend::kAuto, {0, 1}), Devices(0, {{0, kMissing}, {1, kMissing}}));
  ASSERT_TRUE(none_usable.ok()) << none_usable.status();
  EXPECT_EQ((*none_usable)->info().backend, "cpu");
}

TEST(MakeExecutor, SomeDevicesUnusableStopsTheStartNamingThem) {
  for (Backend backend : {Backend::kAuto, Backend::kCuda}) {
    // A listed device that is missing, after or before a usable one.
    for (const auto& [devices, broken] :
         std::vector<std::pair<std::vector<int>, int>>{{{0, 7}, 7}, {{0, 1}, 0}}) {
      auto made = MakeExecutor(With(backend, devices), Devices(2, {{broken, kMissing}}));
      ASSERT_FALSE(made.ok());
      EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition);
      const std::string message(made.status().message());
      EXPECT_NE(message.find(absl::StrCat("device ", broken, ": cudaSetDevice")), std::string::npos)
          << message;
      EXPECT_NE(message.find("--devices"), std::string::npos) << message;
    }
    // --devices=all, one of three unusable.
    auto all = MakeExecutor(With(backend, {0}, /*all=*/true), Devices(3, {{1, kMissing}}));
    ASSERT_FALSE(all.ok());
    EXPECT_EQ(all.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(all.status().message().find("devices 0, 2 usable"), std::string::npos)
        << all.status();
  }
}

TEST(MakeExecutor, ADeviceWithoutCodeInThisBuildStopsAuto) {
  auto made = MakeExecutor(
      With(Backend::kAuto, {0}),
      Devices(1, {{0, absl::FailedPreconditionError("sm_75: no code in this build")}}));
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(made.status().message().find("--backend auto: sm_75"), std::string::npos)
      << made.status();
}

TEST(MakeExecutor, CudaNeverFallsBack) {
  auto no_gpu = MakeExecutor(With(Backend::kCuda, {0, 1}),
                             Devices(absl::UnavailableError("no usable CUDA device")));
  ASSERT_FALSE(no_gpu.ok());
  EXPECT_EQ(no_gpu.status().message(), "--backend cuda: no usable CUDA device");

  auto made = MakeExecutor(With(Backend::kCuda, {0}), Devices(1, {{0, kMissing}}));
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(made.status().message().find("--backend cuda: device 0: cudaSetDevice"),
            std::string::npos)
      << made.status();
}

TEST(MakeExecutor, CpuTriesNoDevice) {
  CudaExecutorFactory untouched = {
      .device_count = []() -> absl::StatusOr<int> {
        ADD_FAILURE() << "device count read";
        return 0;
      },
      .create = [](const Config&) -> absl::StatusOr<std::unique_ptr<Executor>> {
        ADD_FAILURE() << "CUDA executor made";
        return absl::InternalError("unreachable");
      }};
  auto made = MakeExecutor(With(Backend::kCpu, {3, 5}, /*all=*/true), untouched);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ((*made)->info().backend, "cpu");
}

}  // namespace
}  // namespace probesidecar::server
