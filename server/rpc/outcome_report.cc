#include "server/rpc/outcome_report.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace probesidecar::server {
namespace {

double Decimal(float bound) {
  char text[32];
  for (int digits = 1; digits < 10; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, static_cast<double>(bound));
    const double value = std::strtod(text, nullptr);
    if (static_cast<float>(value) == bound) return value;
  }
  return bound;
}

// Adds slot `slot` of `counts` into `out` (sized for the set: Sized).
void AddOutcomes(const kernels::ProbeOutcomeCounts& counts, int32_t slot, v1::ProbeOutcomes* out) {
  const kernels::ProbeOutcomeLayout& l = counts.layout;
  const int32_t buckets = l.num_bounds + 1;
  out->set_rows_scored(out->rows_scored() + counts.rows(slot));
  for (int32_t p = 0; p < l.num_probes; ++p) {
    out->set_fired(p, out->fired(p) + counts.fired(slot, p));
    out->set_non_finite(p, out->non_finite(p) + counts.non_finite(slot, p));
    out->set_score_sum(p, out->score_sum(p) + counts.sum(slot, p));
    for (int32_t b = 0; b < buckets; ++b) {
      const int index = p * buckets + b;
      out->set_bucket_counts(index, out->bucket_counts(index) + counts.bucket(slot, p, b));
    }
  }
}

// `out` with every array at its size for `set`, zero.
void Sized(const ProbeSet& set, v1::ProbeOutcomes* out) {
  const int p = set.num_probes;
  const int buckets = static_cast<int>(set.score_bounds.size()) + 1;
  out->mutable_fired()->Resize(p, 0);
  out->mutable_non_finite()->Resize(p, 0);
  out->mutable_score_sum()->Resize(p, 0.0);
  out->mutable_bucket_counts()->Resize(p * buckets, 0);
}

}  // namespace

std::vector<double> ScoreBoundsAsDecimals(const ProbeSet& set) {
  std::vector<double> bounds;
  for (float bound : set.score_bounds) bounds.push_back(Decimal(bound));
  return bounds;
}

void FillProbeOutcomes(const ProbeSet& set, const kernels::ProbeOutcomeCounts& counts,
                       const OutcomeLabels& labels, v1::ProbeSetInfo* info) {
  // A set whose outcomes are not counted has none (the field unset), not counts of zero.
  if (!set.count_outcomes) return;
  v1::ProbeOutcomes* total = info->mutable_outcomes();
  // Every probe has its counts, also before anything was scored.
  Sized(set, total);
  if (counts.slots == 0 || counts.layout.num_probes != set.num_probes ||
      counts.layout.num_bounds != static_cast<int32_t>(set.score_bounds.size())) {
    return;
  }
  const std::vector<std::vector<std::string>> values = labels.Values();
  for (int32_t slot = 0; slot < counts.slots; ++slot) {
    if (!counts.Any(slot)) continue;
    AddOutcomes(counts, slot, total);
    v1::LabelledProbeOutcomes* labelled = info->add_outcomes_by_labels();
    if (slot < static_cast<int32_t>(values.size())) {
      for (size_t k = 0; k < labels.keys().size(); ++k) {
        if (!values[slot][k].empty()) {
          (*labelled->mutable_labels())[labels.keys()[k]] = values[slot][k];
        }
      }
    }
    Sized(set, labelled->mutable_outcomes());
    AddOutcomes(counts, slot, labelled->mutable_outcomes());
  }
}

void AppendOutcomeSeries(const ProbeSet& set, const kernels::ProbeOutcomeCounts& counts,
                         const std::vector<std::vector<std::string>>& label_values,
                         uint32_t max_probe_labels, std::vector<ProbeSetOutcomeSeries>* out) {
  const kernels::ProbeOutcomeLayout& l = counts.layout;
  if (l.num_probes != set.num_probes) return;
  const bool by_name = static_cast<uint32_t>(set.num_probes) <= max_probe_labels;
  const std::vector<double> bounds = ScoreBoundsAsDecimals(set);
  for (int32_t slot = 0; slot < counts.slots; ++slot) {
    if (!counts.Any(slot)) continue;
    ProbeSetOutcomeSeries& series = out->emplace_back();
    series.probe_set = set.name;
    if (slot < static_cast<int32_t>(label_values.size())) series.label_values = label_values[slot];
    series.bounds = bounds;
    series.rows = counts.rows(slot);
    if (!by_name) series.probes.emplace_back().probe = kAllProbes;
    for (int32_t p = 0; p < l.num_probes; ++p) {
      if (by_name) series.probes.emplace_back().probe = set.probes[p].name;
      ProbeOutcomeSeries& probe = series.probes.back();
      probe.buckets.resize(static_cast<size_t>(l.num_bounds) + 1, 0);
      probe.scored += counts.rows(slot);
      probe.fired += counts.fired(slot, p);
      probe.non_finite += counts.non_finite(slot, p);
      probe.sum += counts.sum(slot, p);
      for (int32_t b = 0; b <= l.num_bounds; ++b) probe.buckets[b] += counts.bucket(slot, p, b);
    }
  }
}

}  // namespace probesidecar::server
