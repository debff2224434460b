// The labels of the probe-outcome series that a session declares when it opens (e.g. model,
// replica): which label names sessions may use (--session-labels), and each distinct set of
// values, numbered as a label slot, up to --max-session-label-sets of them. A set of values seen
// past the cap is counted in the slot kOther, whose values are all "_other", so the number of
// series stays bounded whatever clients declare. Slots are never reused: a counter keeps its
// series for as long as the server runs.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace probesidecar::server {

class OutcomeLabels {
 public:
  // Sessions that declare no label, and requests without a session: every value "".
  static constexpr int kUnlabelled = 0;
  // Sessions whose values came past the cap: every value kOtherValue.
  static constexpr int kOther = 1;
  static constexpr int kFirstDeclared = 2;
  static constexpr char kOtherValue[] = "_other";
  // Label names and values a session may use (what the names and values are checked against).
  static constexpr int kMaxKeys = 8;
  static constexpr int kMaxValueLength = 64;

  // `keys`: checked by ValidateKeys first. `max_sets`: distinct value sets with a slot of their
  // own.
  OutcomeLabels(std::vector<std::string> keys, int max_sets);

  // OK for label names a server may offer sessions: at most kMaxKeys, each a Prometheus label name
  // ([a-zA-Z_][a-zA-Z0-9_]*, up to 32 characters, not starting with "__") that no series of the
  // server already carries (probe_set, probe, le, device, ...), each once.
  static absl::Status ValidateKeys(const std::vector<std::string>& keys);

  // The slot of a session declaring `labels` (name -> value): INVALID_ARGUMENT for a name not in
  // keys() or a malformed value (1 to kMaxValueLength characters of [A-Za-z0-9_.:/@+-], not
  // kOtherValue). No labels: kUnlabelled. A new set of values past the cap: kOther, and `*folded`
  // is set.
  absl::StatusOr<int> SlotFor(const std::map<std::string, std::string>& labels, bool* folded);

  const std::vector<std::string>& keys() const { return keys_; }
  // Slots there can ever be with `max_sets` distinct sets of values (what counters are sized for).
  static int SlotsFor(int max_sets) { return kFirstDeclared + max_sets; }
  int max_slots() const { return SlotsFor(max_sets_); }
  // The values of every slot handed out so far, [slot][key] (slots kUnlabelled and kOther always).
  std::vector<std::vector<std::string>> Values() const;

 private:
  const std::vector<std::string> keys_;
  const int max_sets_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, int> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<std::string>> values_ ABSL_GUARDED_BY(mu_);  // [slot][key]
};

}  // namespace probesidecar::server
