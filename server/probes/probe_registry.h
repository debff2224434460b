// The loaded probe sets, by name. Thread-safe; readers get shared_ptrs, so a set that is
// unloaded or replaced while a request uses it stays alive until that request finishes.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/probes/probe_set.h"

namespace probesidecar::server {

// How a set is loaded: the precision asked for (resolved for its shape) and whether its outcomes
// are counted. Converts from a precision alone (counted).
struct ProbeSetOptions {
  kernels::ProbePrecisionRequest precision = kernels::ProbePrecisionRequest::kDefault;
  bool count_outcomes = true;

  ProbeSetOptions() = default;
  ProbeSetOptions(kernels::ProbePrecisionRequest precision_request)  // NOLINT: implicit
      : precision(precision_request) {}
  ProbeSetOptions(kernels::ProbePrecisionRequest precision_request, bool counted)
      : precision(precision_request), count_outcomes(counted) {}
};

class ProbeRegistry {
 public:
  // Called on a fully parsed set before it is published (e.g. to upload device weights into
  // set.placements). An error refuses the load and changes nothing.
  using PrepareFn = std::function<absl::Status(ProbeSet& set)>;

  // `probes_dir` bounds LoadFromPath: paths resolve relative to it and must stay inside it
  // (open_beneath.h). Empty: path loading is refused. limits.max_sets and max_total_bytes cap
  // what is loaded at once.
  ProbeRegistry(std::string probes_dir, ProbeSetLimits limits, PrepareFn prepare);

  // ALREADY_EXISTS if loaded and !replace; INVALID_ARGUMENT for bad names or files; NOT_FOUND
  // for missing files; PERMISSION_DENIED for paths outside probes_dir; RESOURCE_EXHAUSTED for
  // files over the size limit, or when the set would pass max_sets or max_total_bytes.
  // `options.precision` is resolved for the set's shape (ResolveProbePrecision) before the
  // prepare hook runs, so the hook lays the weights out for the precision the set reports.
  absl::StatusOr<std::shared_ptr<const ProbeSet>> LoadFromPath(
      absl::string_view name, absl::string_view path, bool replace, ProbeSetOptions options = {});
  absl::StatusOr<std::shared_ptr<const ProbeSet>> LoadFromBytes(
      absl::string_view name, std::string bytes, bool replace, ProbeSetOptions options = {});
  // NOT_FOUND when not loaded.
  absl::Status Unload(absl::string_view name);
  // nullptr when not loaded.
  std::shared_ptr<const ProbeSet> Find(absl::string_view name) const;
  // Sorted by name.
  std::vector<std::shared_ptr<const ProbeSet>> List() const;
  size_t size() const;
  // weight_bytes() of the loaded sets together.
  uint64_t total_bytes() const;

  // Loads every *.safetensors file of probes_dir, named by its stem, in name order. An error
  // when the directory cannot be read; otherwise the files that failed to load, each with its
  // status (they are skipped: the others load). Each with `options` (--probe-precision,
  // --probe-outcomes).
  absl::StatusOr<std::vector<absl::Status>> LoadDirectory(ProbeSetOptions options = {});

  const std::string& probes_dir() const { return probes_dir_; }

 private:
  absl::StatusOr<std::shared_ptr<const ProbeSet>> Publish(
      absl::string_view name, absl::StatusOr<common::SafetensorsFile> file, std::string source,
      bool replace, ProbeSetOptions options);
  // RESOURCE_EXHAUSTED when loading `set` as `name` would pass max_sets or max_total_bytes.
  absl::Status CheckCaps(absl::string_view name, const ProbeSet& set) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::string probes_dir_;
  const ProbeSetLimits limits_;
  const PrepareFn prepare_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const ProbeSet>, std::less<>> sets_ ABSL_GUARDED_BY(mu_);
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace probesidecar::server
