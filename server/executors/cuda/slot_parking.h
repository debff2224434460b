// Which of a CUDA executor's stream slots take shared requests. A slot whose stream still has work
// pending (an enqueue-only request, or one given up at its deadline, may wait on a client's ready
// event for long) is parked: its worker takes no request from the shared queue until the GPU is
// past that work (the host callback that follows the work nudges the worker: MaybeUnpark), so
// that no request waits behind it. A slot parked for long is logged once.
#pragma once

#include <vector>

#include "server/executors/cuda/cuda_worker.h"
#include "server/executors/worker_pool.h"

namespace probesidecar::server {

class SlotParking {
 public:
  // A parked slot is logged about once it has waited this long.
  static constexpr double kWarnSeconds = 1.0;

  // `workers[i]` is worker i of `pool`; both outlive this.
  SlotParking(const std::vector<Worker>* workers, WorkerPool* pool)
      : workers_(workers), pool_(pool) {}

  // Whether `worker`'s slot may take a request now: its stream is idle. Otherwise it is parked.
  bool Admit(int worker);
  // After a request: parks the slot at once if its stream still has the work pending.
  void ParkIfBusy(int worker);
  // Unparks the slot if its stream is past what it waited for.
  void MaybeUnpark(int worker);
  // Logs, once per parking, each slot parked for kWarnSeconds or more (the device monitor).
  void WarnLongParked();

 private:
  void Park(int worker);
  StreamSlot& slot(int worker) const { return *(*workers_)[worker].slot; }

  const std::vector<Worker>* const workers_;
  WorkerPool* const pool_;
};

}  // namespace probesidecar::server
