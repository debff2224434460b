#include "tests/faults/fault_injection.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/observability/log.h"

namespace probesidecar::server {
namespace {

class FaultInjectingExecutor final : public Executor {
 public:
  FaultInjectingExecutor(std::unique_ptr<Executor> inner, uint64_t every)
      : inner_(std::move(inner)), every_(every) {
    inner_->SetFatalHandler([this](const absl::Status& why) { ReportFatal(why); });
  }
  ~FaultInjectingExecutor() override { inner_->SetFatalHandler({}); }

  const ExecutorInfo& info() const override { return inner_->info(); }
  absl::Status Place(ProbeSet& set) override { return inner_->Place(set); }
  void Warmup(std::shared_ptr<const ProbeSet> set, WarmupDone done) override {
    inner_->Warmup(std::move(set), std::move(done));
  }
  void Submit(ExecutorTask task) override {
    // Answers the injected failure where the request succeeded.
    if (NextFails()) {
      AnswerThrough(task, [](absl::Status status) { return status.ok() ? Injected() : status; });
    }
    inner_->Submit(std::move(task));
  }
  ExecutorStats ReadStats(const StatsRead& read) override { return inner_->ReadStats(read); }
  kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet& set) const override {
    return inner_->OutcomeCounts(set);
  }
  bool ShutdownBy(absl::Time deadline) override { return inner_->ShutdownBy(deadline); }

 private:
  bool NextFails() { return (submitted_.fetch_add(1) + 1) % every_ == 0; }

  // What CudaStatus makes of a failed launch, marked as injected.
  static absl::Status Injected() {
    return absl::InternalError(absl::StrCat(
        "cudaGraphLaunch: cudaErrorLaunchFailure: unspecified launch failure (injected by ",
        kFaultEveryEnv, ", a test-only fault hook)"));
  }

  const std::unique_ptr<Executor> inner_;
  const uint64_t every_;
  std::atomic<uint64_t> submitted_{0};
};

}  // namespace

std::unique_ptr<Executor> InjectFaults(std::unique_ptr<Executor> inner, uint64_t every) {
  LogWarning(
      "%s=%d: Score/Verify requests number %d, %d, ... will fail with INTERNAL (a test-only fault "
      "hook)",
      kFaultEveryEnv, every, every, 2 * every);
  return std::make_unique<FaultInjectingExecutor>(std::move(inner), every);
}

uint64_t FaultEveryFromEnvironment() {
  const char* value = std::getenv(kFaultEveryEnv);
  uint64_t every = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &every)) return 0;
  return every;
}

}  // namespace probesidecar::server
