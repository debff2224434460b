#include "server/executors/executor.h"

#include <utility>

namespace probesidecar::server {

void Refuse(ExecutorTask task, absl::Status status) {
  if (auto* score = std::get_if<ScoreTask>(&task)) {
    std::move(score->done)(std::move(score->job), std::move(status), ScoreTimings{});
  } else {
    auto& verify = std::get<VerifyTask>(task);
    std::move(verify.done)(std::move(verify.job), std::move(status), VerifyResult{});
  }
}

void Executor::SetFatalHandler(FatalHandler handler) {
  absl::MutexLock lock(&fatal_mu_);
  fatal_handler_ = std::move(handler);
}

void Executor::ReportFatal(const absl::Status& why) {
  FatalHandler handler;
  {
    absl::MutexLock lock(&fatal_mu_);
    handler = std::move(fatal_handler_);
    fatal_handler_ = nullptr;
  }
  if (handler) handler(why);
}

}  // namespace probesidecar::server
