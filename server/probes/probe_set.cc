#include "server/probes/probe_set.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/probe_outcomes/probe_outcomes_limits.h"
#include "nlohmann/json.hpp"

namespace probesidecar::server {
namespace {

using Json = nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; the conversions below copy it as is");

constexpr size_t kMaxNameLength = 128;

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

struct NestedValue {};

// Parses a metadata value that must be a flat JSON array (no nested arrays or objects: no
// legitimate entry needs them, and refusing them bounds the work a hostile value can cause).
absl::StatusOr<Json> ParseFlatArray(absl::string_view key, const std::string& text) {
  // nlohmann stops at a NUL byte as if the input ended there; refuse it instead.
  if (text.find('\0') != std::string::npos) {
    return Invalid(absl::StrCat("metadata \"", key, "\" contains a NUL character"));
  }
  Json parsed;
  try {
    Json::parser_callback_t no_nesting = [](int depth, Json::parse_event_t event, Json&) {
      if (depth > 0 && (event == Json::parse_event_t::object_start ||
                        event == Json::parse_event_t::array_start)) {
        throw NestedValue{};
      }
      return true;
    };
    parsed = Json::parse(text.begin(), text.end(), no_nesting, /*allow_exceptions=*/true,
                         /*ignore_comments=*/false);
  } catch (const NestedValue&) {
    return Invalid(absl::StrCat("metadata \"", key, "\" has a nested array or object"));
  } catch (const Json::parse_error& e) {
    return Invalid(absl::StrCat("metadata \"", key, "\" is not valid JSON: ",
                                common::JsonErrorForMessage(e.what())));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory while parsing metadata \"", key, "\""));
  } catch (const std::exception& e) {
    return Invalid(absl::StrCat("metadata \"", key, "\" is not valid JSON: ", e.what()));
  }
  if (!parsed.is_array()) {
    return Invalid(
        absl::StrCat("metadata \"", key, "\" is not a JSON array (", parsed.type_name(), ")"));
  }
  return parsed;
}

absl::StatusOr<common::DType> ProbeDType(const common::SafetensorsTensor& tensor) {
  if (tensor.dtype == "F32") return common::DType::kFloat32;
  if (tensor.dtype == "F16") return common::DType::kFloat16;
  if (tensor.dtype == "BF16") return common::DType::kBFloat16;
  return Invalid(absl::StrCat("tensor \"", tensor.name, "\" has dtype ", tensor.dtype,
                              "; expected F32, F16 or BF16"));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Converts little-endian elements to float32. `count` elements are present (checked by the
// caller against the shape; the reader checked the shape against the bytes).
void ConvertToFloat(absl::Span<const uint8_t> data, common::DType dtype, size_t count,
                    std::vector<float>& out) {
  out.resize(count);
  if (dtype == common::DType::kFloat32) {
    std::memcpy(out.data(), data.data(), count * sizeof(float));
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data.data() + 2 * i, sizeof(bits));
    out[i] =
        dtype == common::DType::kFloat16 ? common::HalfToFloat(bits) : common::Bf16ToFloat(bits);
  }
}

absl::Status ParseProbeNames(const std::map<std::string, std::string>& metadata, int32_t p,
                             std::vector<ProbeSpec>& probes) {
  auto it = metadata.find("probe_names");
  if (it == metadata.end()) {
    for (int32_t i = 0; i < p; ++i) probes[i].name = absl::StrCat("probe_", i);
    return absl::OkStatus();
  }
  absl::StatusOr<Json> names = ParseFlatArray("probe_names", it->second);
  if (!names.ok()) return names.status();
  if (names->size() != static_cast<size_t>(p)) {
    return Invalid(absl::StrCat("metadata \"probe_names\" has ", names->size(),
                                " entries but weight has ", p, " probes"));
  }
  std::map<std::string, int32_t> seen;
  for (int32_t i = 0; i < p; ++i) {
    const Json& entry = (*names)[i];
    if (!entry.is_string()) {
      return Invalid(
          absl::StrCat("probe_names[", i, "] is not a string (", entry.type_name(), ")"));
    }
    probes[i].name = entry.get<std::string>();
    if (probes[i].name.empty()) return Invalid(absl::StrCat("probe_names[", i, "] is empty"));
    auto [prev, inserted] = seen.emplace(probes[i].name, i);
    if (!inserted) {
      return Invalid(absl::StrCat("probe_names[", i, "] ", common::QuoteForMessage(probes[i].name),
                                  " duplicates probe_names[", prev->second, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseThresholds(const std::map<std::string, std::string>& metadata, int32_t p,
                             std::vector<ProbeSpec>& probes) {
  auto it = metadata.find("thresholds");
  if (it == metadata.end()) return absl::OkStatus();
  absl::StatusOr<Json> thresholds = ParseFlatArray("thresholds", it->second);
  if (!thresholds.ok()) return thresholds.status();
  if (thresholds->size() != static_cast<size_t>(p)) {
    return Invalid(absl::StrCat("metadata \"thresholds\" has ", thresholds->size(),
                                " entries but weight has ", p, " probes"));
  }
  for (int32_t i = 0; i < p; ++i) {
    const Json& entry = (*thresholds)[i];
    if (entry.is_null()) continue;
    if (!entry.is_number()) {
      return Invalid(absl::StrCat("thresholds[", i, "] is neither a number nor null (",
                                  entry.type_name(), ")"));
    }
    const double value = entry.get<double>();
    const float threshold = static_cast<float>(value);
    if (!std::isfinite(value) || !std::isfinite(threshold)) {
      return Invalid(absl::StrCat("thresholds[", i, "] = ", value, " is not a finite float"));
    }
    probes[i].threshold = threshold;
  }
  return absl::OkStatus();
}

absl::StatusOr<kernels::Activation> ParseActivation(
    const std::map<std::string, std::string>& metadata) {
  auto it = metadata.find("activation");
  if (it == metadata.end() || it->second == "none") return kernels::Activation::kNone;
  if (it->second == "sigmoid") return kernels::Activation::kSigmoid;
  return Invalid(absl::StrCat("metadata \"activation\" is ", common::QuoteForMessage(it->second),
                              "; expected \"none\" or \"sigmoid\""));
}

absl::Status ParseScoreBuckets(const std::map<std::string, std::string>& metadata,
                               std::vector<float>& bounds) {
  auto it = metadata.find("score_buckets");
  if (it == metadata.end()) return absl::OkStatus();
  absl::StatusOr<Json> buckets = ParseFlatArray("score_buckets", it->second);
  if (!buckets.ok()) return buckets.status();
  if (buckets->empty() || buckets->size() > static_cast<size_t>(kernels::kMaxScoreBounds)) {
    return Invalid(absl::StrCat("metadata \"score_buckets\" has ", buckets->size(),
                                " entries; expected 1 to ", kernels::kMaxScoreBounds));
  }
  bounds.clear();
  for (size_t i = 0; i < buckets->size(); ++i) {
    const Json& entry = (*buckets)[i];
    if (!entry.is_number()) {
      return Invalid(
          absl::StrCat("score_buckets[", i, "] is not a number (", entry.type_name(), ")"));
    }
    const double value = entry.get<double>();
    const float bound = static_cast<float>(value);
    if (!std::isfinite(value) || !std::isfinite(bound)) {
      return Invalid(absl::StrCat("score_buckets[", i, "] = ", value, " is not a finite float"));
    }
    if (!bounds.empty() && !(bound > bounds.back())) {
      return Invalid(absl::StrCat("score_buckets[", i, "] = ", value,
                                  " is not above the entry before it (ascending, each once)"));
    }
    bounds.push_back(bound);
  }
  return absl::OkStatus();
}

uint64_t NextProbeSetId() {
  static std::atomic<uint64_t> next_id{1};
  return next_id.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::vector<float> ScoreBoundsFor(kernels::Activation activation,
                                  const std::vector<ProbeSpec>& probes) {
  constexpr int kBuckets = 20;
  double lo = -10, hi = 10;
  if (activation == kernels::Activation::kSigmoid) {
    lo = 0;
    hi = 1;
  } else {
    bool any = false;
    double least = 0, greatest = 0;
    for (const ProbeSpec& probe : probes) {
      if (!probe.threshold.has_value()) continue;
      least = any ? std::min<double>(least, *probe.threshold) : *probe.threshold;
      greatest = any ? std::max<double>(greatest, *probe.threshold) : *probe.threshold;
      any = true;
    }
    if (any) {
      const double w = std::max(greatest - least, 1.0);
      lo = least - w;
      hi = greatest + w;
    }
  }
  std::vector<float> bounds;
  for (int k = 1; k <= kBuckets; ++k) {
    const double value = lo + (hi - lo) * k / kBuckets;
    // Thresholds near float's range can put bounds past it: those are left out.
    if (!(std::fabs(value) <= std::numeric_limits<float>::max())) continue;
    const float bound = static_cast<float>(value);
    // Far from zero a float step can exceed the bucket width: keep the bounds ascending.
    if (bounds.empty() || bound > bounds.back()) bounds.push_back(bound);
  }
  return bounds;
}

std::vector<float> ThresholdsOrNaN(const ProbeSet& set) {
  std::vector<float> thresholds(static_cast<size_t>(std::max(set.num_probes, 0)),
                                std::numeric_limits<float>::quiet_NaN());
  for (size_t p = 0; p < thresholds.size() && p < set.probes.size(); ++p) {
    if (set.probes[p].threshold.has_value()) thresholds[p] = *set.probes[p].threshold;
  }
  return thresholds;
}

absl::Status ValidateProbeSetName(absl::string_view name) {
  if (name.empty()) return Invalid("probe set name is empty");
  if (name.size() > kMaxNameLength) {
    return Invalid(absl::StrCat("probe set name is ", name.size(),
                                " characters, over the limit of ", kMaxNameLength));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) {
      return Invalid(absl::StrCat("probe set name ", common::QuoteForMessage(name),
                                  " has an invalid character at ", i,
                                  " (allowed: A-Z a-z 0-9 _ . -)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ProbeSet>> ProbeSetFromSafetensors(
    absl::string_view name, const common::SafetensorsFile& file, std::string source,
    const ProbeSetLimits& limits) {
  if (absl::Status status = ValidateProbeSetName(name); !status.ok()) return status;
  for (const common::SafetensorsTensor& tensor : file.tensors()) {
    if (tensor.name != "weight" && tensor.name != "bias") {
      return Invalid(absl::StrCat("unexpected tensor ", common::QuoteForMessage(tensor.name),
                                  " (a probe set has exactly \"weight\" and \"bias\")"));
    }
  }
  const common::SafetensorsTensor* weight = file.Find("weight");
  if (weight == nullptr) return Invalid("missing tensor \"weight\" [P, H]");
  const common::SafetensorsTensor* bias = file.Find("bias");
  if (bias == nullptr) return Invalid("missing tensor \"bias\" [P]");
  absl::StatusOr<common::DType> weight_dtype = ProbeDType(*weight);
  if (!weight_dtype.ok()) return weight_dtype.status();
  absl::StatusOr<common::DType> bias_dtype = ProbeDType(*bias);
  if (!bias_dtype.ok()) return bias_dtype.status();

  if (weight->shape.size() != 2) {
    return Invalid(absl::StrCat("tensor \"weight\" has shape ", ShapeString(weight->shape),
                                "; expected [P, H]"));
  }
  if (bias->shape.size() != 1) {
    return Invalid(
        absl::StrCat("tensor \"bias\" has shape ", ShapeString(bias->shape), "; expected [P]"));
  }
  const int64_t p = weight->shape[0];
  const int64_t h = weight->shape[1];
  if (p < 1) return Invalid("tensor \"weight\" has 0 probes (P must be at least 1)");
  if (h < 1) return Invalid("tensor \"weight\" has hidden size 0 (H must be at least 1)");
  if (p > limits.max_probes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tensor \"weight\" has ", p, " probes, over the limit of ", limits.max_probes));
  }
  if (h > limits.max_hidden) {
    return absl::ResourceExhaustedError(absl::StrCat("tensor \"weight\" has hidden size ", h,
                                                     ", over the limit of ", limits.max_hidden));
  }
  if (bias->shape[0] != p) {
    return Invalid(absl::StrCat("tensor \"bias\" has ", bias->shape[0],
                                " entries but \"weight\" has ", p, " probes"));
  }

  auto set = std::make_shared<ProbeSet>();
  set->name = std::string(name);
  set->num_probes = static_cast<int32_t>(p);
  set->hidden = static_cast<int32_t>(h);
  set->weight_dtype = *weight_dtype;
  set->source = std::move(source);
  set->file_bytes = file.file_bytes();
  set->probes.resize(static_cast<size_t>(p));

  const std::map<std::string, std::string>& metadata = file.metadata();
  if (absl::Status status = ParseProbeNames(metadata, set->num_probes, set->probes); !status.ok()) {
    return status;
  }
  absl::StatusOr<kernels::Activation> activation = ParseActivation(metadata);
  if (!activation.ok()) return activation.status();
  set->activation = *activation;
  if (absl::Status status = ParseThresholds(metadata, set->num_probes, set->probes); !status.ok()) {
    return status;
  }
  set->score_bounds = ScoreBoundsFor(set->activation, set->probes);
  if (absl::Status status = ParseScoreBuckets(metadata, set->score_bounds); !status.ok()) {
    return status;
  }

  // P <= max_probes and H <= max_hidden (int32), so P * H fits in size_t; the reader already
  // checked that the bytes match the shape.
  const size_t weight_count = static_cast<size_t>(p) * static_cast<size_t>(h);
  if (file.Data(*weight).size() != weight_count * common::DTypeSize(*weight_dtype) ||
      file.Data(*bias).size() != static_cast<size_t>(p) * common::DTypeSize(*bias_dtype)) {
    return absl::InternalError("tensor bytes do not match their shapes");  // the reader checks
  }
  try {
    ConvertToFloat(file.Data(*weight), *weight_dtype, weight_count, set->weight);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", weight_count, " float32 weights"));
  }
  ConvertToFloat(file.Data(*bias), *bias_dtype, static_cast<size_t>(p), set->bias);
  for (size_t i = 0; i < weight_count; ++i) {
    if (!std::isfinite(set->weight[i])) {
      return Invalid(absl::StrCat("weight[", i / static_cast<size_t>(h), ", ",
                                  i % static_cast<size_t>(h), "] is not finite (", set->weight[i],
                                  ")"));
    }
  }
  for (size_t i = 0; i < static_cast<size_t>(p); ++i) {
    if (!std::isfinite(set->bias[i])) {
      return Invalid(absl::StrCat("bias[", i, "] is not finite (", set->bias[i], ")"));
    }
  }
  set->id = NextProbeSetId();
  return set;
}

}  // namespace probesidecar::server
