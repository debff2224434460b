// What the probes found, as the API and the metrics show it: the executor's counts of a probe set
// (kernels::ProbeOutcomeCounts, per label slot) into ProbeSetInfo's outcomes (ListProbeSets,
// ServerInfo) and into the metrics' outcome series, where the cardinality bounds apply (a set of
// more than --max-probe-labels probes: one "_all" series per label slot; session labels past
// --max-session-label-sets: "_other", OutcomeLabels).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/probe_outcomes/probe_outcomes.h"
#include "probesidecar/v1/probes.pb.h"
#include "server/observability/metrics.h"
#include "server/observability/outcome_labels.h"
#include "server/probes/probe_set.h"

namespace probesidecar::server {

// A set's histogram bounds as the decimals they were written as (the float nearest to each
// bound, printed with the fewest digits that give it back: 0.05, not 0.0500000007).
std::vector<double> ScoreBoundsAsDecimals(const ProbeSet& set);

// Fills `info`'s outcomes (every slot together, and per set of labels that scored) from `counts`.
void FillProbeOutcomes(const ProbeSet& set, const kernels::ProbeOutcomeCounts& counts,
                       const OutcomeLabels& labels, v1::ProbeSetInfo* info);

// The metrics' series of `set` from `counts`: one group per label slot that scored, probes named
// up to `max_probe_labels`, else one kAllProbes series.
void AppendOutcomeSeries(const ProbeSet& set, const kernels::ProbeOutcomeCounts& counts,
                         const std::vector<std::vector<std::string>>& label_values,
                         uint32_t max_probe_labels, std::vector<ProbeSetOutcomeSeries>* out);

}  // namespace probesidecar::server
