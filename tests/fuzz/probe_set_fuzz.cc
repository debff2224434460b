// Fuzz target: building a probe set from a parsed safetensors file (weight, bias, and the
// probe_names / activation / thresholds metadata).
//
// Properties: a refusal is a clean one-line message (never INTERNAL); an accepted set has P
// distinct non-empty names, P finite thresholds or none, P x H finite float32 weights and P finite
// biases, within the limits.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "common/safetensors.h"
#include "server/probes/probe_set.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/message_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  probesidecar::server::ProbeSetLimits limits;
  limits.max_probes = 1024;
  limits.max_hidden = 4096;
  limits.file.max_file_bytes = 1 << 20;
  limits.file.max_header_bytes = 1 << 16;
  absl::StatusOr<probesidecar::common::SafetensorsFile> file =
      probesidecar::common::SafetensorsFile::Parse(
          std::string(reinterpret_cast<const char*>(data), size), limits.file);
  if (!file.ok()) return 0;  // the reader has its own target

  absl::StatusOr<std::shared_ptr<probesidecar::server::ProbeSet>> set =
      probesidecar::server::ProbeSetFromSafetensors("fuzz", *file, "inline", limits);
  if (!set.ok()) {
    probesidecar::fuzz::CheckRefusalMessage(set.status());
    return 0;
  }
  const probesidecar::server::ProbeSet& s = **set;
  FUZZ_CHECK(s.num_probes >= 1 && s.num_probes <= limits.max_probes);
  FUZZ_CHECK(s.hidden >= 1 && s.hidden <= limits.max_hidden);
  const size_t p = static_cast<size_t>(s.num_probes);
  FUZZ_CHECK(s.probes.size() == p);
  FUZZ_CHECK(s.weight.size() == p * static_cast<size_t>(s.hidden));
  FUZZ_CHECK(s.bias.size() == p);
  std::set<std::string> names;
  for (const probesidecar::server::ProbeSpec& probe : s.probes) {
    FUZZ_CHECK(!probe.name.empty());
    FUZZ_CHECK(names.insert(probe.name).second);
    FUZZ_CHECK(!probe.threshold.has_value() || std::isfinite(*probe.threshold));
  }
  for (float w : s.weight) FUZZ_CHECK(std::isfinite(w));
  for (float b : s.bias) FUZZ_CHECK(std::isfinite(b));
  FUZZ_CHECK(s.file_bytes == size);
  return 0;
}
