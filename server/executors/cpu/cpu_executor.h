// The CPU backend: probe scoring on the CPU's threads (inline tensors only). Large requests are
// split into tasks that run in parallel; the CPU scorer accumulates in float32 like the GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "server/executors/executor.h"
#include "server/executors/worker_pool.h"

namespace probesidecar::server {

class CpuExecutor final : public Executor {
 public:
  // threads == 0: one per core. At most `max_queued_tasks` tasks wait for a thread.
  CpuExecutor(uint32_t threads, size_t max_queued_tasks);
  ~CpuExecutor() override;

  const char* backend() const override { return "cpu"; }
  std::string device_name() const override;
  absl::Status PrepareProbeSet(ProbeSet&) override { return absl::OkStatus(); }
  BufferRegistry* buffers() override { return nullptr; }
  void Score(const ScoreJob* job, ScoreDone done) override;
  uint64_t queued() const override { return pool_.queued(); }
  void Shutdown() override;

 private:
  WorkerPool pool_;
};

}  // namespace probesidecar::server
