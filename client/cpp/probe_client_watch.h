// probe-client watch: a live table of what the probes found (fire rates, scores per second, score
// quantiles), refreshed from ListProbeSets every interval, for a person at a shell.
#pragma once

#include <string>
#include <vector>

#include "client/cpp/client.h"

namespace probesidecar::client {

struct WatchOptions {
  std::string probe_set;          // only this set ("": every set)
  double interval_seconds = 1.0;  // between refreshes
  int count = 0;                  // refreshes before it returns (0: until interrupted)
  int top = 0;                    // probes per set, highest fire rate first (0: all, in order)
  bool by_labels = false;         // a block per set of session labels, not their sum
  bool clear_screen = false;      // redraw in place (a terminal) instead of appending tables
};

// One table: `now`, with rates over the `seconds` since `before` (nullptr: totals only).
std::string OutcomeTable(const std::vector<v1::ProbeSetInfo>* before,
                         const std::vector<v1::ProbeSetInfo>& now, double seconds,
                         const WatchOptions& options);

// Refreshes the table until options.count tables were shown (or forever); 1 on a failed call.
int Watch(Client& client, const WatchOptions& options);

}  // namespace probesidecar::client
