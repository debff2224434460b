// One executor over several devices: each served CUDA device has its own executor (context,
// stream slots, graph cache, staging, device memory), and this one routes each request to the
// executor of its device — the device of the buffers it names (validation refuses a request whose
// buffers and events are on different devices), or, for one that names no buffer (inline tensors
// only), the device with the fewest requests waiting. A probe set is placed on every device.
// A device whose context is lost takes the whole server down (the fatal handler fires once, the
// reason naming the device), as one device alone does.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/executors/executor.h"

namespace probesidecar::server {

class MultiDeviceExecutor final : public Executor {
 public:
  // `executors[i]` serves the device `devices[i]` (ascending, each once; at least one).
  MultiDeviceExecutor(std::vector<int> devices, std::vector<std::unique_ptr<Executor>> executors);
  ~MultiDeviceExecutor() override;

  const char* backend() const override;
  // The first device's name, with the count when there are several ("NVIDIA H200 (x2)").
  std::string device_name() const override;
  std::vector<int> devices() const override { return devices_; }
  // The first device's (ServerInfo's top-level fields); each device's in stats().devices.
  std::string compute_capability() const override {
    return executors_.front()->compute_capability();
  }
  std::vector<std::string> kernel_paths() const override {
    return executors_.front()->kernel_paths();
  }
  // Summed over the devices (mps: any of them), with every device's report.
  ExecutorStats stats() const override;
  uint64_t queued() const override;

  // Places the set on every device (each executor uploads its own copy); the first failure
  // refuses the set, and whatever was placed goes with it.
  absl::Status PrepareProbeSet(ProbeSet& set) override;
  void Warmup(const std::shared_ptr<const ProbeSet>& set, WarmupDone done) override;

  void Score(std::unique_ptr<ScoreJob> job, ScoreDone done) override;
  void Verify(std::unique_ptr<VerifyJob> job, VerifyDone done) override;

  // Summed over the devices (each device counts the requests it ran).
  kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet& set) const override;
  void RefreshOutcomes(absl::Time deadline) override;
  void RequestOutcomeRefresh() override;

  void SetFatalHandler(FatalHandler handler) override;
  void Shutdown() override;
  bool ShutdownBy(absl::Time deadline) override;

 private:
  // The executor of `device`, or nullptr when it is not served.
  Executor* For(int device) const;
  // The executor of a job that names no device: the one with the fewest requests waiting.
  Executor* LeastQueued() const;

  const std::vector<int> devices_;
  const std::vector<std::unique_ptr<Executor>> executors_;
  // The handler the server set, called once whichever device fails first.
  struct Fatal {
    absl::Mutex mu;
    FatalHandler handler ABSL_GUARDED_BY(mu);
    bool fired ABSL_GUARDED_BY(mu) = false;
  };
  const std::shared_ptr<Fatal> fatal_ = std::make_shared<Fatal>();
};

}  // namespace probesidecar::server
