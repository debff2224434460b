#include "server/rpc/metrics_sources.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/rpc/outcome_report.h"

namespace probesidecar::server {

MetricsState CollectMetricsState(const MetricsSources& from) {
  Executor& executor = *from.executor;
  MetricsState state;
  // What the probes found: a fresh copy of the device counters (the executor's device monitors
  // make it; a device that does not answer in time keeps its previous copy), with the stats.
  state.executor =
      executor.ReadStats({OutcomeCopy::kWait, absl::Now() + absl::Milliseconds(500)});
  state.session_labels = from.outcome_labels->keys();
  const std::vector<std::vector<std::string>> label_values = from.outcome_labels->Values();
  for (const std::shared_ptr<const ProbeSet>& set : from.probes->List()) {
    AppendOutcomeSeries(*set, executor.OutcomeCounts(*set), label_values,
                        from.config->max_probe_labels, &state.probe_outcomes);
  }
  state.probe_sets = from.probes->size();
  state.probe_set_load_errors = from.probe_set_load_errors;
  if (from.ipc != nullptr) {
    const BufferCounters counters = from.ipc->buffers.counters();
    state.registered_buffers = counters.registrations;
    state.registered_buffer_bytes = counters.registered_bytes;
    state.open_ipc_handles = counters.open_handles;
  }
  // Each device's report moves to its entry, beside the IPC registry's counters there.
  for (DeviceReport& report : state.executor.devices) {
    DeviceMetricsState& d = state.devices.emplace_back();
    d.executor = std::move(report);
    if (from.ipc != nullptr) {
      const BufferCounters counters = from.ipc->buffers.counters(d.executor.device);
      d.registered_buffers = counters.registrations;
      d.registered_buffer_bytes = counters.registered_bytes;
      d.open_ipc_handles = counters.open_handles;
    }
  }
  state.executor.devices.clear();
  return state;
}

}  // namespace probesidecar::server
