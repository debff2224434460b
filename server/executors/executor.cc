#include "server/executors/executor.h"

#include <memory>
#include <utility>
#include <vector>

namespace probesidecar::server {

void Refuse(ExecutorTask task, absl::Status status) {
  std::visit([&status](auto& t) { std::move(t.done)(std::move(t.job), std::move(status), {}); },
             task);
}

std::vector<WarmupDone> SplitWarmupDone(WarmupDone done, int parts) {
  struct Join {
    absl::Mutex mu;
    int remaining ABSL_GUARDED_BY(mu);
    absl::Status status ABSL_GUARDED_BY(mu);
    WarmupDone done ABSL_GUARDED_BY(mu);
  };
  if (parts <= 0) {
    std::move(done)(absl::OkStatus());
    return {};
  }
  auto join = std::make_shared<Join>();
  {
    absl::MutexLock lock(&join->mu);
    join->remaining = parts;
    join->done = std::move(done);
  }
  std::vector<WarmupDone> out;
  for (int i = 0; i < parts; ++i) {
    out.emplace_back([join](absl::Status status) {
      WarmupDone finished;
      absl::Status answer;
      {
        absl::MutexLock lock(&join->mu);
        if (join->status.ok()) join->status = std::move(status);
        if (--join->remaining == 0) {
          finished = std::move(join->done);
          answer = join->status;
        }
      }
      if (finished) std::move(finished)(std::move(answer));
    });
  }
  return out;
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
