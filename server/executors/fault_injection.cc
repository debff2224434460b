#include "server/executors/fault_injection.h"

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
      : inner_(std::move(inner)), every_(every) {}

  const char* backend() const override { return inner_->backend(); }
  std::string device_name() const override { return inner_->device_name(); }
  absl::Status PrepareProbeSet(ProbeSet& set) override { return inner_->PrepareProbeSet(set); }
  std::vector<int> devices() const override { return inner_->devices(); }
  void Warmup(const std::shared_ptr<const ProbeSet>& set, WarmupDone done) override {
    inner_->Warmup(set, std::move(done));
  }

  void Score(std::unique_ptr<ScoreJob> job, ScoreDone done) override {
    inner_->Score(std::move(job), NextFails() ? FailIfOk<ScoreJob, ScoreTimings>(std::move(done))
                                              : std::move(done));
  }

  void Verify(std::unique_ptr<VerifyJob> job, VerifyDone done) override {
    inner_->Verify(std::move(job), NextFails() ? FailIfOk<VerifyJob, VerifyOutcome>(std::move(done))
                                               : std::move(done));
  }

  ExecutorStats stats() const override { return inner_->stats(); }
  uint64_t queued() const override { return inner_->queued(); }
  std::string compute_capability() const override { return inner_->compute_capability(); }
  std::vector<std::string> kernel_paths() const override { return inner_->kernel_paths(); }
  kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet& set) const override {
    return inner_->OutcomeCounts(set);
  }
  void RefreshOutcomes(absl::Time deadline) override { inner_->RefreshOutcomes(deadline); }
  void RequestOutcomeRefresh() override { inner_->RequestOutcomeRefresh(); }
  void SetFatalHandler(FatalHandler handler) override {
    inner_->SetFatalHandler(std::move(handler));
  }
  void Shutdown() override { inner_->Shutdown(); }
  bool ShutdownBy(absl::Time deadline) override { return inner_->ShutdownBy(deadline); }

 private:
  bool NextFails() { return (submitted_.fetch_add(1) + 1) % every_ == 0; }

  // `done`, answering the injected failure where the request succeeded.
  template <typename Job, typename Outcome, typename Done>
  static Done FailIfOk(Done done) {
    return [done = std::move(done)](std::unique_ptr<Job> job, absl::Status status,
                                    const Outcome& outcome) mutable {
      std::move(done)(std::move(job), status.ok() ? Injected() : status, outcome);
    };
  }

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
