#include "server/executors/multi_device_executor.h"

#include <optional>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"

namespace probesidecar::server {
namespace {

// What a request whose buffers are on a device this server does not serve answers.
absl::Status NotServed(int device) {
  return absl::InvalidArgumentError(absl::StrCat("the request's buffers are on CUDA device ",
                                                 device, ", which this server does not serve"));
}

// The first executor's info, with every device and a name for them all.
ExecutorInfo CombinedInfo(const std::vector<int>& devices,
                          const std::vector<std::unique_ptr<Executor>>& executors) {
  ExecutorInfo info = executors.front()->info();
  info.devices = devices;
  const std::string first = info.device_name;
  bool same = true;
  std::string names;
  for (const auto& e : executors) {
    same = same && e->info().device_name == first;
    absl::StrAppend(&names, names.empty() ? "" : ", ", e->info().device_name);
  }
  info.device_name = !same                  ? names
                     : executors.size() == 1 ? first
                                             : absl::StrCat(first, " (x", executors.size(), ")");
  return info;
}

}  // namespace

MultiDeviceExecutor::MultiDeviceExecutor(std::vector<int> devices,
                                         std::vector<std::unique_ptr<Executor>> executors)
    : devices_(std::move(devices)),
      executors_(std::move(executors)),
      info_(CombinedInfo(devices_, executors_)),
      in_flight_(std::make_shared<std::vector<std::atomic<uint64_t>>>(executors_.size())) {
  // A device that can no longer serve takes the server down: the reason names it, once
  // (ReportFatal drops the handler after its first call, whichever device fails first).
  for (size_t i = 0; i < executors_.size(); ++i) {
    executors_[i]->SetFatalHandler([this, device = devices_[i]](const absl::Status& why) {
      ReportFatal(
          absl::Status(why.code(), absl::StrCat("CUDA device ", device, ": ", why.message())));
    });
  }
}

MultiDeviceExecutor::~MultiDeviceExecutor() {
  Shutdown();
  for (const auto& e : executors_) e->SetFatalHandler({});
}

ExecutorStats MultiDeviceExecutor::ReadStats(const StatsRead& read) {
  // Every device's monitor copies at once; then each is waited for.
  if (read.outcome_copy == OutcomeCopy::kWait) {
    for (const auto& e : executors_) e->ReadStats({OutcomeCopy::kAsk});
  }
  ExecutorStats total;
  for (const auto& e : executors_) total += e->ReadStats(read);
  return total;
}

int MultiDeviceExecutor::IndexOf(int device) const {
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i] == device) return static_cast<int>(i);
  }
  return -1;
}

int MultiDeviceExecutor::LeastBusy() const {
  int best = 0;
  for (size_t i = 1; i < executors_.size(); ++i) {
    if ((*in_flight_)[i].load() < (*in_flight_)[best].load()) best = static_cast<int>(i);
  }
  return best;
}

absl::Status MultiDeviceExecutor::Place(ProbeSet& set) {
  for (size_t i = 0; i < executors_.size(); ++i) {
    if (absl::Status s = executors_[i]->Place(set); !s.ok()) {
      set.placements.clear();  // the copies placed so far are freed with it
      return absl::Status(s.code(), absl::StrCat("CUDA device ", devices_[i], ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

void MultiDeviceExecutor::Warmup(std::shared_ptr<const ProbeSet> set, WarmupDone done) {
  std::vector<WarmupDone> parts =
      SplitWarmupDone(std::move(done), static_cast<int>(executors_.size()));
  for (size_t i = 0; i < parts.size(); ++i) executors_[i]->Warmup(set, std::move(parts[i]));
}

void MultiDeviceExecutor::Submit(ExecutorTask task) {
  const std::optional<int> device =
      std::visit([](const auto& t) -> std::optional<int> { return t.job->device; }, task);
  const int i = device.has_value() ? IndexOf(*device) : LeastBusy();
  if (i < 0) {
    Refuse(std::move(task), NotServed(*device));
    return;
  }
  // In flight on executor i until its answer comes (whichever thread it comes on).
  (*in_flight_)[i].fetch_add(1);
  AnswerThrough(task, [flight = in_flight_, i](absl::Status status) {
    (*flight)[i].fetch_sub(1);
    return status;
  });
  executors_[i]->Submit(std::move(task));
}

kernels::ProbeOutcomeCounts MultiDeviceExecutor::OutcomeCounts(const ProbeSet& set) const {
  kernels::ProbeOutcomeCounts total;
  for (const auto& e : executors_) total.Add(e->OutcomeCounts(set));
  return total;
}

bool MultiDeviceExecutor::ShutdownBy(absl::Time deadline) {
  bool clean = true;
  for (const auto& e : executors_) clean = e->ShutdownBy(deadline) && clean;
  return clean;
}

}  // namespace probesidecar::server
