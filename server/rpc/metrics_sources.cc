#include "server/rpc/metrics_sources.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/rpc/outcome_report.h"

namespace probesidecar::server {

MetricsState CollectMetricsState(const MetricsSources& from) {
  Executor& executor = *from.executor;
  MetricsState state;
  // What the probes found: a fresh copy of the device counters (the executor's device monitors
  // make it; a device that does not answer in time keeps its previous copy).
  executor.RefreshOutcomes(absl::Now() + absl::Milliseconds(500));
  state.session_labels = from.outcome_labels->keys();
  const std::vector<std::vector<std::string>> label_values = from.outcome_labels->Values();
  for (const std::shared_ptr<const ProbeSet>& set : from.probes->List()) {
    AppendOutcomeSeries(*set, executor.OutcomeCounts(*set), label_values,
                        from.config->max_probe_labels, &state.probe_outcomes);
  }
  state.probe_sets = from.probes->size();
  state.probe_set_load_errors = from.probe_set_load_errors;
  state.graph_cache = executor.graph_cache();
  state.device_memory_bytes = executor.device_memory_bytes();
  state.queued_requests = executor.queued();
  state.queue_capacity = executor.queue_capacity();
  const DroppedRequests dropped = executor.dropped();
  state.expired_requests = dropped.expired;
  state.cancelled_requests = dropped.cancelled;
  state.invalid_device_rows = executor.invalid_device_rows();
  state.invalid_verify_requests = executor.invalid_verify_requests();
  state.non_finite_device_scores = executor.non_finite_device_scores();
  state.parked_slots = executor.parked_slots();
  state.mps = executor.mps();
  if (from.ipc != nullptr) {
    const BufferCounters counters = from.ipc->buffers.counters();
    state.registered_buffers = counters.registrations;
    state.registered_buffer_bytes = counters.registered_bytes;
    state.open_ipc_handles = counters.open_handles;
  }
  for (const DeviceReport& report : executor.device_reports()) {
    DeviceMetricsState& d = state.devices.emplace_back();
    d.device = absl::StrCat(report.device);
    d.up = report.failure.empty();
    d.memory_bytes = report.memory_bytes;
    d.parked_slots = report.parked_slots;
    d.graph_cache = report.graph_cache;
    if (from.ipc != nullptr) {
      const BufferCounters counters = from.ipc->buffers.counters(report.device);
      d.registered_buffers = counters.registrations;
      d.registered_buffer_bytes = counters.registered_bytes;
      d.open_ipc_handles = counters.open_handles;
    }
  }
  return state;
}

}  // namespace probesidecar::server
