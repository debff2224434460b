// The CPU backend: a correct, multithreaded reference (inline tensors only).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "server/executor.h"

namespace probesidecar::server {

class CpuExecutor final : public Executor {
 public:
  // threads == 0: one per core.
  explicit CpuExecutor(uint32_t threads);
  ~CpuExecutor() override;

  const char* backend() const override { return "cpu"; }
  std::string device_name() const override;
  absl::Status PrepareProbeSet(ProbeSet&) override { return absl::OkStatus(); }
  BufferRegistry* buffers() override { return nullptr; }
  void Score(const ScoreJob* job, ScoreDone done) override;
  void Shutdown() override;

 private:
  using Task = absl::AnyInvocable<void() &&>;
  void Enqueue(std::vector<Task> tasks);
  void WorkerLoop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace probesidecar::server
