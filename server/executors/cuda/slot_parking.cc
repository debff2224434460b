#include "server/executors/cuda/slot_parking.h"

#include <algorithm>

#include "server/observability/log.h"

namespace probesidecar::server {

bool SlotParking::Admit(int worker) {
  if (slot(worker).Idle()) return true;
  Park(worker);
  return false;
}

void SlotParking::ParkIfBusy(int worker) {
  if (!slot(worker).Idle()) Park(worker);
}

void SlotParking::Park(int worker) {
  StreamSlot& s = slot(worker);
  if (!s.parked()) s.SetParked(true);
  pool_->SetTakesShared(worker, false);
  // The work may have finished meanwhile, its nudge already handled: check again.
  MaybeUnpark(worker);
}

void SlotParking::MaybeUnpark(int worker) {
  StreamSlot& s = slot(worker);
  if (!s.parked() || !s.Idle()) return;
  const double seconds = s.parked_seconds();
  s.SetParked(false);
  pool_->SetTakesShared(worker, true);
  if (seconds >= kWarnSeconds) {
    LogInfo("stream slot %d takes requests again after %.1f s waiting on the GPU", worker, seconds);
  }
}

void SlotParking::WarnLongParked() {
  const std::vector<Worker>& workers = *workers_;
  for (size_t i = 0; i < workers.size(); ++i) {
    StreamSlot& s = *workers[i].slot;
    if (s.parked() && s.parked_seconds() >= kWarnSeconds && s.TakeParkWarning()) {
      LogWarning(
          "stream slot %d has waited %.1f s on the GPU for work whose ready event has not fired (a "
          "client's stream is stuck, or the client is gone); it takes no request until the GPU is "
          "past that work; %d of %d slots serve meanwhile",
          static_cast<int>(i), s.parked_seconds(),
          static_cast<int>(std::count_if(workers.begin(), workers.end(),
                                         [](const Worker& w) { return !w.slot->parked(); })),
          static_cast<int>(workers.size()));
    }
  }
}

}  // namespace probesidecar::server
