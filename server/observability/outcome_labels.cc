#include "server/observability/outcome_labels.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace probesidecar::server {
namespace {

// Label names the server's own series carry (or Prometheus adds when it scrapes).
constexpr const char* kReserved[] = {"probe_set", "probe",      "le",          "device",      "rpc",
                                     "code",      "stage",      "kernel_path", "instance",    "job",
                                     "version",   "git_commit", "backend",     "cuda_runtime"};

bool LabelNameChar(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (!first && c >= '0' && c <= '9');
}

bool ValueChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         absl::StrContains("_.:/@+-", c);
}

}  // namespace

OutcomeLabels::OutcomeLabels(std::vector<std::string> keys, int max_sets)
    : keys_(std::move(keys)), max_sets_(max_sets) {
  values_.push_back(std::vector<std::string>(keys_.size()));
  values_.push_back(std::vector<std::string>(keys_.size(), kOtherValue));
}

absl::Status OutcomeLabels::ValidateKeys(const std::vector<std::string>& keys) {
  if (keys.size() > kMaxKeys) {
    return absl::InvalidArgumentError(
        absl::StrCat(keys.size(), " session labels; at most ", kMaxKeys));
  }
  std::set<std::string> seen;
  for (const std::string& key : keys) {
    bool ok = !key.empty() && key.size() <= 32 && !absl::StartsWith(key, "__");
    for (size_t i = 0; ok && i < key.size(); ++i) ok = LabelNameChar(key[i], i == 0);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "session label '", key,
          "' is not a label name ([a-zA-Z_][a-zA-Z0-9_]*, up to 32 characters, no leading __)"));
    }
    if (std::find(std::begin(kReserved), std::end(kReserved), key) != std::end(kReserved)) {
      return absl::InvalidArgumentError(
          absl::StrCat("session label '", key, "' is a label the server's series already carry"));
    }
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat("session label '", key, "' is listed twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> OutcomeLabels::SlotFor(const std::map<std::string, std::string>& labels,
                                           bool* folded) {
  *folded = false;
  std::vector<std::string> values(keys_.size());
  for (const auto& [key, value] : labels) {
    const auto it = std::find(keys_.begin(), keys_.end(), key);
    if (it == keys_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels: '", key.substr(0, 64), "' is not a session label of this server (",
          keys_.empty() ? "it offers none" : absl::StrCat("it offers ", absl::StrJoin(keys_, ", ")),
          "; --session-labels)"));
    }
    bool ok = !value.empty() && value.size() <= kMaxValueLength && value != kOtherValue;
    for (size_t i = 0; ok && i < value.size(); ++i) ok = ValueChar(value[i]);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("labels: the value of '", key, "' must be 1 to ", kMaxValueLength,
                       " characters of A-Z a-z 0-9 _ . : / @ + - (and not \"", kOtherValue, "\")"));
    }
    values[it - keys_.begin()] = value;
  }
  if (std::all_of(values.begin(), values.end(), [](const std::string& v) { return v.empty(); })) {
    return kUnlabelled;
  }
  absl::MutexLock lock(&mu_);
  if (const auto it = slots_.find(values); it != slots_.end()) return it->second;
  if (static_cast<int>(slots_.size()) >= max_sets_) {
    *folded = true;
    return kOther;
  }
  const int slot = static_cast<int>(values_.size());
  slots_.emplace(values, slot);
  values_.push_back(std::move(values));
  return slot;
}

std::vector<std::vector<std::string>> OutcomeLabels::Values() const {
  absl::MutexLock lock(&mu_);
  return values_;
}

}  // namespace probesidecar::server
