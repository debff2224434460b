// A probe set: frozen linear probes W [P, H], b [P] with names, activation and thresholds,
// parsed from one safetensors file.
//
// File contract: tensors "weight" [P, H] and "bias" [P] (F32, F16 or BF16; nothing else), and
// in __metadata__ (all optional):
//   "probe_names": JSON array of P distinct non-empty strings (default "probe_0".."probe_{P-1}")
//   "activation":  "none" or "sigmoid" (default "none")
//   "thresholds":  JSON array of P entries, each a finite number or null (default: all null)
//   "score_buckets": JSON array of 1 to kMaxScoreBounds finite numbers, strictly ascending: the
//                  upper bounds of the buckets of the set's score histogram (a bucket above the
//                  last comes on top). Default: ScoreBoundsFor (the activation and thresholds).
// Other metadata keys (e.g. "format": "pt" from torch) are kept and ignored. Weights must be
// finite. Weights and bias are converted to float32 once, here.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/safetensors.h"
#include "kernels/probe_score/probe_score_activation.h"
#include "kernels/probe_score/probe_score_precision.h"

namespace probesidecar::server {

struct ProbeSpec {
  std::string name;
  std::optional<float> threshold;
};

struct ProbeSetLimits {
  int32_t max_probes = 65536;
  int32_t max_hidden = 65536;
  common::SafetensorsLimits file;
  // For the registry: sets loaded at once, and their weight_bytes() together.
  size_t max_sets = 256;
  uint64_t max_total_bytes = uint64_t{16} << 30;
};

// The base of what an executor attaches to a probe set it places (ProbeSet::placements): each
// backend derives its own (its device weights, its outcome counters), so that a placement is typed,
// not a pointer to anything.
class ProbeSetPlacement {
 public:
  virtual ~ProbeSetPlacement() = default;
};
// The key of the CPU backend's placement (the CUDA backend's are device ordinals).
inline constexpr int kHostPlacement = -1;

struct ProbeSet {
  std::string name;
  uint64_t id = 0;         // unique per loaded instance (a reload gets a new id)
  int32_t num_probes = 0;  // P
  int32_t hidden = 0;      // H
  common::DType weight_dtype = common::DType::kFloat32;  // as stored in the file
  kernels::Activation activation = kernels::Activation::kNone;
  // How its weights meet 16-bit activations (probe_score_precision.h), resolved once at load
  // from what the load asked for (ResolveProbePrecision); every score of this set uses it.
  kernels::ProbePrecision precision = kernels::ProbePrecision::kExact;
  std::vector<ProbeSpec> probes;  // [P]
  std::vector<float> weight;      // [P, H] float32
  std::vector<float> bias;        // [P]
  std::string source;             // path, or "inline"
  uint64_t file_bytes = 0;
  // Upper bounds of the buckets of each probe's score histogram (probe outcomes: the metrics and
  // ListProbeSets), ascending, at most kernels::kMaxScoreBounds.
  std::vector<float> score_bounds;
  // Whether its outcomes are counted (--probe-outcomes, LoadProbeSetRequest.outcome_counting),
  // resolved at load. Not counted: the CPU backend makes no counters; the CUDA backend keeps the
  // set's thresholds and bounds on the device (the count kernel reads them where the answer still
  // needs its pass: a response's copy, a synchronous output's non-finite count) but never gives a
  // request a counter slot, and leaves the count out of the graph where nothing needs it.
  bool count_outcomes = true;
  // What the executor attached when it placed the set (Executor::Place), by device ordinal
  // (kHostPlacement for the CPU backend): the weights in the form it scores with and the counters
  // of the probes' outcomes, in a class of its own derived from ProbeSetPlacement. Attached once
  // before the set is published, freed with the last reference.
  std::map<int, std::shared_ptr<const ProbeSetPlacement>> placements;

  // The placement on `device` as the type T the executor placed it as, or nullptr (none there, or
  // not a T: a placement is read only by the executor that made it).
  template <typename T>
  const T* PlacementAs(int device) const {
    static_assert(std::is_base_of_v<ProbeSetPlacement, T>);
    const auto it = placements.find(device);
    return it == placements.end() ? nullptr : dynamic_cast<const T*>(it->second.get());
  }

  // Bytes of the float32 weight and bias (one copy).
  uint64_t weight_bytes() const { return (weight.size() + bias.size()) * sizeof(float); }
};

// The default score-histogram bounds of a set without "score_buckets": for sigmoid sets 0.05,
// 0.10, ..., 1 (20 equal buckets over [0, 1]); for raw scores with thresholds, 20 equal buckets
// over [lo - w, hi + w], lo and hi the least and greatest threshold and w = max(hi - lo, 1) (so a
// single threshold t is the middle bound of [t - 1, t + 1]); without thresholds, -9, -8, ..., 10.
std::vector<float> ScoreBoundsFor(kernels::Activation activation,
                                  const std::vector<ProbeSpec>& probes);

// Each of the set's P probes' threshold, NaN for none (the form the outcome count reads).
std::vector<float> ThresholdsOrNaN(const ProbeSet& set);

// Names: [A-Za-z0-9_.-], 1 to 128 characters.
absl::Status ValidateProbeSetName(absl::string_view name);

// Builds a probe set from a parsed file. `source` is kept for ListProbeSets.
absl::StatusOr<std::shared_ptr<ProbeSet>> ProbeSetFromSafetensors(
    absl::string_view name, const common::SafetensorsFile& file, std::string source,
    const ProbeSetLimits& limits);

}  // namespace probesidecar::server
