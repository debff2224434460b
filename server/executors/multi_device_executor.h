// One executor over several devices: each served CUDA device has its own executor (context,
// stream slots, graph cache, staging, device memory), and this one routes each request to the
// executor of its device — the device of the buffers it names (validation refuses a request whose
// buffers and events are on different devices), or, for one that names no buffer (inline tensors
// only), the device with the fewest of its requests in flight. A probe set is placed on every
// device.
// A device whose context is lost takes the whole server down (the fatal handler fires once, the
// reason naming the device), as one device alone does.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "server/executors/executor.h"

namespace probesidecar::server {

class MultiDeviceExecutor final : public Executor {
 public:
  // `executors[i]` serves the device `devices[i]` (ascending, each once; at least one).
  MultiDeviceExecutor(std::vector<int> devices, std::vector<std::unique_ptr<Executor>> executors);
  ~MultiDeviceExecutor() override;

  // The first device's backend, compute capability and kernel paths (ServerInfo's top-level
  // fields; each device's in stats().devices), its name with the count when there are several
  // ("NVIDIA H200 (x2)"), every served device.
  const ExecutorInfo& info() const override { return info_; }

  // Places the set on every device (each executor uploads its own copy); the first failure
  // refuses the set, and whatever was placed goes with it.
  absl::Status Place(ProbeSet& set) override;
  void Warmup(std::shared_ptr<const ProbeSet> set, WarmupDone done) override;

  // To the executor of the job's device; a Score that names none (inline tensors) to the device
  // with the fewest of this executor's requests in flight.
  void Submit(ExecutorTask task) override;

  // Summed over the devices (mps: any of them), with every device's report; an outcome copy is
  // asked of every device at once, then each is waited for.
  ExecutorStats ReadStats(const StatsRead& read) override;
  // Summed over the devices (each device counts the requests it ran).
  kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet& set) const override;

  bool ShutdownBy(absl::Time deadline) override;

 private:
  // The index of `device`'s executor, or -1 when it is not served.
  int IndexOf(int device) const;
  // The executor for a job that names no device: the one with the fewest requests in flight.
  int LeastBusy() const;

  const std::vector<int> devices_;
  const std::vector<std::unique_ptr<Executor>> executors_;
  const ExecutorInfo info_;
  // Requests submitted to each executor and not yet answered (routing; shared with the callbacks,
  // which may outlive a call).
  const std::shared_ptr<std::vector<std::atomic<uint64_t>>> in_flight_;
};

}  // namespace probesidecar::server
