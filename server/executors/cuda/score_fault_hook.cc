#include "server/executors/cuda/score_fault_hook.h"

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace probesidecar::server {
namespace {

ABSL_CONST_INIT absl::Mutex hook_mutex(absl::kConstInit);
ScoreFaultHook installed ABSL_GUARDED_BY(hook_mutex);

}  // namespace

void InstallScoreFaultHook(ScoreFaultHook hook) {
  absl::MutexLock lock(&hook_mutex);
  installed = hook;
}

ScoreFaultHook InstalledScoreFaultHook() {
  absl::MutexLock lock(&hook_mutex);
  return installed;
}

}  // namespace probesidecar::server
