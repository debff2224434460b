#include "client/cpp/probe_client_watch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace probesidecar::client {
namespace {

// The outcomes a block of the table shows: every session's, or one set of labels'.
struct Block {
  std::string title;
  const v1::ProbeOutcomes* now = nullptr;
  const v1::ProbeOutcomes* before = nullptr;  // the same block in the previous table, if any
};

std::string LabelsText(const v1::LabelledProbeOutcomes& labelled) {
  if (labelled.labels().empty()) return "{no labels}";
  const std::map<std::string, std::string> sorted(labelled.labels().begin(),
                                                  labelled.labels().end());
  std::vector<std::string> parts;
  for (const auto& [key, value] : sorted) parts.push_back(absl::StrCat(key, "=", value));
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

// The q-quantile of a probe's finite scores from its histogram, interpolated inside the bucket as
// Prometheus' histogram_quantile does (the first bucket from 0, or from its bound when that is
// negative; the bucket above every bound answers the last bound).
std::string Quantile(const v1::ProbeOutcomes& outcomes, int probe, const v1::ProbeSetInfo& set,
                     double q) {
  const int buckets = set.score_bucket_bounds_size() + 1;
  if (outcomes.bucket_counts_size() < (probe + 1) * buckets) return "-";
  const uint64_t* counts = outcomes.bucket_counts().data() + probe * buckets;
  uint64_t count = 0;
  for (int b = 0; b < buckets; ++b) count += counts[b];
  if (count == 0) return "-";
  const double rank = q * static_cast<double>(count);
  uint64_t below = 0;
  for (int b = 0; b < buckets; ++b) {
    const uint64_t in = counts[b];
    if (static_cast<double>(below + in) >= rank && in > 0) {
      if (b >= set.score_bucket_bounds_size()) {
        return absl::StrFormat("%.3g", set.score_bucket_bounds(set.score_bucket_bounds_size() - 1));
      }
      const double upper = set.score_bucket_bounds(b);
      const double lower = b > 0 ? set.score_bucket_bounds(b - 1) : std::min(0.0, upper);
      return absl::StrFormat("%.3g", lower + (upper - lower) * (rank - below) / in);
    }
    below += in;
  }
  return "-";
}

std::string Percent(uint64_t fired, uint64_t scored) {
  if (scored == 0) return "-";
  return absl::StrFormat("%.2f%%",
                         100.0 * static_cast<double>(fired) / static_cast<double>(scored));
}

void AppendBlock(const v1::ProbeSetInfo& set, const Block& block, double seconds,
                 const WatchOptions& options, std::string* out) {
  const v1::ProbeOutcomes& now = *block.now;
  const uint64_t rows_before = block.before != nullptr ? block.before->rows_scored() : 0;
  const uint64_t new_rows = now.rows_scored() - std::min(now.rows_scored(), rows_before);
  absl::StrAppendFormat(out, "%s: %d rows scored", block.title, now.rows_scored());
  if (block.before != nullptr && seconds > 0) {
    absl::StrAppendFormat(out, ", %.1f rows/s", static_cast<double>(new_rows) / seconds);
  }
  absl::StrAppend(out, "\n");
  absl::StrAppendFormat(out, "  %-24s %10s %10s %12s %12s %12s %10s %8s %8s\n", "probe",
                        "threshold", "fired/s", "rate (last)", "rate (all)", "fired", "non-finite",
                        "p50", "p90");
  struct Row {
    int probe;
    double sort_key;
  };
  std::vector<Row> rows;
  // Fired since the previous table, by probe.
  auto new_fired = [&](int p) {
    const uint64_t before =
        block.before != nullptr && p < block.before->fired_size() ? block.before->fired(p) : 0;
    return now.fired(p) - std::min(now.fired(p), before);
  };
  const int probes = std::min({now.fired_size(), now.non_finite_size(), set.probes_size()});
  for (int p = 0; p < probes; ++p) {
    const double rate = new_rows > 0 ? static_cast<double>(new_fired(p)) / new_rows
                        : now.rows_scored() > 0
                            ? static_cast<double>(now.fired(p)) / now.rows_scored()
                            : 0;
    rows.push_back({p, rate});
  }
  if (options.top > 0) {
    std::stable_sort(rows.begin(), rows.end(),
                     [](const Row& a, const Row& b) { return a.sort_key > b.sort_key; });
    if (static_cast<int>(rows.size()) > options.top) rows.resize(options.top);
  }
  for (const Row& row : rows) {
    const int p = row.probe;
    const v1::Probe& spec = set.probes(p);
    const bool interval = block.before != nullptr && seconds > 0;
    absl::StrAppendFormat(
        out, "  %-24s %10s %10s %12s %12s %12d %10d %8s %8s\n", spec.name().substr(0, 24),
        spec.has_threshold() ? absl::StrFormat("%.4g", spec.threshold()) : "-",
        interval ? absl::StrFormat("%.1f", static_cast<double>(new_fired(p)) / seconds) : "-",
        interval ? Percent(new_fired(p), new_rows) : "-", Percent(now.fired(p), now.rows_scored()),
        now.fired(p), now.non_finite(p), Quantile(now, p, set, 0.5), Quantile(now, p, set, 0.9));
  }
  absl::StrAppend(out, "\n");
}

}  // namespace

std::string OutcomeTable(const std::vector<v1::ProbeSetInfo>* before,
                         const std::vector<v1::ProbeSetInfo>& now, double seconds,
                         const WatchOptions& options) {
  std::string out;
  bool any = false;
  for (const v1::ProbeSetInfo& set : now) {
    if (!options.probe_set.empty() && set.name() != options.probe_set) continue;
    any = true;
    const v1::ProbeSetInfo* previous = nullptr;
    if (before != nullptr) {
      for (const v1::ProbeSetInfo& b : *before) {
        // A reload starts from zero: compare only with the same set's earlier counts.
        if (b.name() == set.name() && b.source() == set.source() &&
            b.outcomes().rows_scored() <= set.outcomes().rows_scored()) {
          previous = &b;
        }
      }
    }
    const std::string head = absl::StrFormat(
        "%s (%s, %d probes)", set.name(),
        set.activation() == v1::ACTIVATION_SIGMOID ? "sigmoid" : "raw scores", set.num_probes());
    if (!options.by_labels) {
      AppendBlock(set,
                  {head, &set.outcomes(), previous != nullptr ? &previous->outcomes() : nullptr},
                  seconds, options, &out);
      continue;
    }
    if (set.outcomes_by_labels().empty()) absl::StrAppend(&out, head, ": nothing scored yet\n");
    for (const v1::LabelledProbeOutcomes& labelled : set.outcomes_by_labels()) {
      const v1::ProbeOutcomes* earlier = nullptr;
      if (previous != nullptr) {
        for (const v1::LabelledProbeOutcomes& b : previous->outcomes_by_labels()) {
          if (LabelsText(b) == LabelsText(labelled)) earlier = &b.outcomes();
        }
      }
      AppendBlock(set,
                  {absl::StrCat(head, " ", LabelsText(labelled)), &labelled.outcomes(), earlier},
                  seconds, options, &out);
    }
  }
  if (!any) {
    absl::StrAppend(&out, options.probe_set.empty()
                              ? "no probe set is loaded\n"
                              : absl::StrCat("probe set ", options.probe_set, " is not loaded\n"));
  }
  return out;
}

int Watch(Client& client, const WatchOptions& options) {
  std::vector<v1::ProbeSetInfo> before;
  bool have_before = false;
  // A CUDA server answers with its last copy of the device counters and makes the next: a first
  // call, unshown, makes the first table current.
  if (absl::StatusOr<std::vector<v1::ProbeSetInfo>> primed = client.ListProbeSets(); !primed.ok()) {
    std::fprintf(stderr, "probe-client: %s\n", primed.status().ToString().c_str());
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(
      static_cast<int64_t>(std::min(options.interval_seconds, 0.2) * 1000)));
  auto taken = std::chrono::steady_clock::now();
  for (int shown = 0; options.count == 0 || shown < options.count; ++shown) {
    if (shown > 0) {
      std::this_thread::sleep_until(
          taken + std::chrono::microseconds(static_cast<int64_t>(options.interval_seconds * 1e6)));
    }
    const auto now_time = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<v1::ProbeSetInfo>> sets = client.ListProbeSets();
    if (!sets.ok()) {
      std::fprintf(stderr, "probe-client: %s\n", sets.status().ToString().c_str());
      return 1;
    }
    const double seconds = std::chrono::duration<double>(now_time - taken).count();
    const std::time_t wall = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", std::localtime(&wall));
    std::string screen = absl::StrFormat(
        "%s== probe outcomes at %s (every %.3g s; rate = fired / scored; Ctrl-C stops)\n",
        options.clear_screen ? "\x1b[H\x1b[2J" : (shown > 0 ? "\n" : ""), stamp,
        options.interval_seconds);
    absl::StrAppend(&screen,
                    OutcomeTable(have_before ? &before : nullptr, *sets, seconds, options));
    std::fputs(screen.c_str(), stdout);
    std::fflush(stdout);
    before = *std::move(sets);
    have_before = true;
    taken = now_time;
  }
  return 0;
}

}  // namespace probesidecar::client
