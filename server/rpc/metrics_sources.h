// What one scrape of /metrics reads: the service's parts, gathered into a MetricsState.
#pragma once

#include <cstdint>

#include "server/ipc/ipc_registries.h"
#include "server/config/config.h"
#include "server/executors/executor.h"
#include "server/observability/metrics.h"
#include "server/observability/outcome_labels.h"
#include "server/probes/probe_registry.h"

namespace probesidecar::server {

// What the service is made of, for one scrape of /metrics.
struct MetricsSources {
  const Config* config = nullptr;
  ProbeRegistry* probes = nullptr;
  Executor* executor = nullptr;
  const IpcRegistries* ipc = nullptr;  // nullptr: a backend without devices
  const OutcomeLabels* outcome_labels = nullptr;
  uint64_t probe_set_load_errors = 0;
};

MetricsState CollectMetricsState(const MetricsSources& from);

}  // namespace probesidecar::server
