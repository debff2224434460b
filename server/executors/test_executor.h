// TEST-ONLY: an executor whose every method has a harmless default (nothing placed, every task
// refused, no stats, a clean shutdown), for tests that fake one and override what they need.
#pragma once

#include <memory>
#include <utility>

#include "server/executors/executor.h"

namespace probesidecar::server {

class TestExecutor : public Executor {
 public:
  explicit TestExecutor(ExecutorInfo info = {"test", "test executor", {}, "", {}})
      : info_(std::move(info)) {}

  const ExecutorInfo& info() const override { return info_; }
  absl::Status Place(ProbeSet&) override { return absl::OkStatus(); }
  void Warmup(std::shared_ptr<const ProbeSet>, WarmupDone done) override {
    std::move(done)(absl::OkStatus());
  }
  void Submit(ExecutorTask task) override {
    Refuse(std::move(task), absl::UnimplementedError("a test executor that runs nothing"));
  }
  ExecutorStats ReadStats(const StatsRead&) override { return {}; }
  kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet&) const override { return {}; }
  bool ShutdownBy(absl::Time) override { return true; }

  // What a backend does when it can no longer serve (tests fire it).
  using Executor::ReportFatal;

 protected:
  ExecutorInfo info_;
};

}  // namespace probesidecar::server
