#include "server/probes/probe_set.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace probesidecar::server {
namespace {

using ::absl::StatusCode;
using common::DType;

// Little-endian element bytes of `values` in a probe dtype (F16/BF16 rounded to nearest even).
std::string Encode(const std::vector<float>& values, absl::string_view dtype) {
  std::string out;
  for (float v : values) {
    if (dtype == "F32") {
      out.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      const uint16_t bits = dtype == "F16" ? common::FloatToHalf(v) : common::FloatToBf16(v);
      out.append(reinterpret_cast<const char*>(&bits), 2);
    }
  }
  return out;
}

std::string EncodeBits(const std::vector<uint16_t>& bits) {
  return std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2);
}

struct ProbeFile {
  int64_t p = 3;
  int64_t h = 4;
  std::string weight_dtype = "F32";
  std::string bias_dtype = "F32";
  std::vector<float> weight;  // empty: 0.25 * (i % 7) - 0.5
  std::vector<float> bias;    // empty: 0.125 * i
  std::map<std::string, std::string> metadata;

  std::string Bytes() const {
    std::vector<float> w = weight, b = bias;
    if (w.empty()) {
      for (int64_t i = 0; i < p * h; ++i) w.push_back(0.25f * static_cast<float>(i % 7) - 0.5f);
    }
    if (b.empty()) {
      for (int64_t i = 0; i < p; ++i) b.push_back(0.125f * static_cast<float>(i));
    }
    return common::WriteSafetensors({{"weight", weight_dtype, {p, h}, Encode(w, weight_dtype)},
                                     {"bias", bias_dtype, {p}, Encode(b, bias_dtype)}},
                                    metadata);
  }
};

absl::StatusOr<std::shared_ptr<ProbeSet>> LoadBytes(std::string bytes, ProbeSetLimits limits = {},
                                                    absl::string_view name = "test") {
  absl::StatusOr<common::SafetensorsFile> file =
      common::SafetensorsFile::Parse(std::move(bytes), limits.file);
  if (!file.ok()) return file.status();
  return ProbeSetFromSafetensors(name, *file, "inline", limits);
}

absl::StatusOr<std::shared_ptr<ProbeSet>> LoadTensors(
    const std::vector<common::SafetensorsTensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {}, ProbeSetLimits limits = {}) {
  return LoadBytes(common::WriteSafetensors(tensors, metadata), limits);
}

absl::StatusOr<std::shared_ptr<ProbeSet>> LoadWithMetadata(
    const std::map<std::string, std::string>& metadata) {
  ProbeFile file;
  file.metadata = metadata;
  return LoadBytes(file.Bytes());
}

::testing::AssertionResult IsRefused(const absl::StatusOr<std::shared_ptr<ProbeSet>>& result,
                                     StatusCode code, absl::string_view fragment) {
  if (result.ok()) return ::testing::AssertionFailure() << "accepted, expected " << code;
  if (result.status().code() != code || !absl::StrContains(result.status().message(), fragment)) {
    return ::testing::AssertionFailure() << "got " << result.status() << "; expected " << code
                                         << " containing \"" << fragment << "\"";
  }
  return ::testing::AssertionSuccess() << result.status();
}

::testing::AssertionResult IsInvalid(const absl::StatusOr<std::shared_ptr<ProbeSet>>& result,
                                     absl::string_view fragment) {
  return IsRefused(result, StatusCode::kInvalidArgument, fragment);
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// ---- Accepted sets ------------------------------------------------------------------------------

TEST(ProbeSet, DefaultsWithoutMetadata) {
  ProbeFile file;
  const std::string bytes = file.Bytes();
  absl::StatusOr<std::shared_ptr<ProbeSet>> set = LoadBytes(bytes);
  ASSERT_TRUE(set.ok()) << set.status();
  const ProbeSet& s = **set;
  EXPECT_EQ(s.name, "test");
  EXPECT_EQ(s.num_probes, 3);
  EXPECT_EQ(s.hidden, 4);
  EXPECT_EQ(s.weight_dtype, DType::kFloat32);
  EXPECT_EQ(s.activation, kernels::Activation::kNone);
  ASSERT_EQ(s.probes.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s.probes[i].name, absl::StrCat("probe_", i));
    EXPECT_FALSE(s.probes[i].threshold.has_value());
  }
  ASSERT_EQ(s.weight.size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(s.weight[i], 0.25f * static_cast<float>(i % 7) - 0.5f);
  EXPECT_EQ(s.bias, (std::vector<float>{0.0f, 0.125f, 0.25f}));
  EXPECT_EQ(s.source, "inline");
  EXPECT_EQ(s.file_bytes, bytes.size());
  EXPECT_TRUE(s.placements.empty());
  EXPECT_GT(s.id, 0u);
}

TEST(ProbeSet, FullMetadata) {
  absl::StatusOr<std::shared_ptr<ProbeSet>> set =
      LoadWithMetadata({{"probe_names", R"(["toxic", "refusal", "pii"])"},
                        {"activation", "sigmoid"},
                        {"thresholds", "[0.5, null, -2]"},
                        {"format", "pt"},
                        {"anything", "else"}});
  ASSERT_TRUE(set.ok()) << set.status();
  const ProbeSet& s = **set;
  EXPECT_EQ(s.activation, kernels::Activation::kSigmoid);
  EXPECT_EQ(s.probes[0].name, "toxic");
  EXPECT_EQ(s.probes[1].name, "refusal");
  EXPECT_EQ(s.probes[2].name, "pii");
  EXPECT_EQ(s.probes[0].threshold, 0.5f);
  EXPECT_FALSE(s.probes[1].threshold.has_value());
  EXPECT_EQ(s.probes[2].threshold, -2.0f);
}

TEST(ProbeSet, ActivationNoneExplicit) {
  absl::StatusOr<std::shared_ptr<ProbeSet>> set = LoadWithMetadata({{"activation", "none"}});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ((*set)->activation, kernels::Activation::kNone);
}

TEST(ProbeSet, ThresholdsAreRoundedToFloat) {
  absl::StatusOr<std::shared_ptr<ProbeSet>> set =
      LoadWithMetadata({{"thresholds", "[0.1, 3.4e38, 1e-50]"}});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ((*set)->probes[0].threshold, 0.1f);
  EXPECT_EQ((*set)->probes[1].threshold, 3.4e38f);
  EXPECT_EQ((*set)->probes[2].threshold, 0.0f);
}

TEST(ProbeSet, MixedDtypesAndUniqueIds) {
  ProbeFile file;
  file.weight_dtype = "BF16";
  file.bias_dtype = "F16";
  absl::StatusOr<std::shared_ptr<ProbeSet>> a = LoadBytes(file.Bytes());
  absl::StatusOr<std::shared_ptr<ProbeSet>> b = LoadBytes(file.Bytes());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->weight_dtype, DType::kBFloat16);
  // Every test value is exact in bf16 and fp16.
  EXPECT_EQ((*a)->weight[6], 1.0f);
  EXPECT_EQ((*a)->bias[2], 0.25f);
  EXPECT_NE((*a)->id, (*b)->id);
  EXPECT_GT((*b)->id, (*a)->id);
}

TEST(ProbeSet, LimitsAreInclusive) {
  ProbeSetLimits limits;
  limits.max_probes = 3;
  limits.max_hidden = 4;
  EXPECT_TRUE(LoadBytes(ProbeFile{}.Bytes(), limits).ok());
}

// Every finite bf16 and fp16 bit pattern converts exactly: checked against an independent
// formula (ldexp), not only against common/dtype.h.
TEST(ProbeSet, Bf16ConversionIsExact) {
  std::vector<uint16_t> bits;
  for (uint32_t b = 0; b < 65536; ++b) {
    if (((b >> 7) & 0xff) != 0xff) bits.push_back(static_cast<uint16_t>(b));
  }
  const int64_t h = static_cast<int64_t>(bits.size());
  absl::StatusOr<std::shared_ptr<ProbeSet>> set = LoadTensors(
      {{"weight", "BF16", {1, h}, EncodeBits(bits)}, {"bias", "BF16", {1}, EncodeBits({0x3f80})}});
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ((*set)->weight.size(), bits.size());
  EXPECT_EQ((*set)->bias[0], 1.0f);
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint16_t b = bits[i];
    const int exponent = (b >> 7) & 0xff;
    const int mantissa = b & 0x7f;
    double magnitude =
        exponent == 0 ? std::ldexp(mantissa, -133) : std::ldexp(128 + mantissa, exponent - 134);
    const float expected = static_cast<float>((b & 0x8000) ? -magnitude : magnitude);
    ASSERT_TRUE(SameBits((*set)->weight[i], expected))
        << std::hex << b << ": " << (*set)->weight[i] << " vs " << expected;
  }
}

TEST(ProbeSet, Fp16ConversionIsExact) {
  std::vector<uint16_t> bits;
  for (uint32_t b = 0; b < 65536; ++b) {
    if (((b >> 10) & 0x1f) != 0x1f) bits.push_back(static_cast<uint16_t>(b));
  }
  const int64_t h = static_cast<int64_t>(bits.size());
  absl::StatusOr<std::shared_ptr<ProbeSet>> set = LoadTensors(
      {{"weight", "F16", {1, h}, EncodeBits(bits)}, {"bias", "F16", {1}, EncodeBits({0x0001})}});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ((*set)->bias[0], std::ldexp(1.0f, -24));  // smallest subnormal
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint16_t b = bits[i];
    const int exponent = (b >> 10) & 0x1f;
    const int mantissa = b & 0x3ff;
    double magnitude =
        exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
    const float expected = static_cast<float>((b & 0x8000) ? -magnitude : magnitude);
    ASSERT_TRUE(SameBits((*set)->weight[i], expected))
        << std::hex << b << ": " << (*set)->weight[i] << " vs " << expected;
  }
  EXPECT_EQ((*set)->weight[0x3c00], 1.0f);
  EXPECT_EQ((*set)->weight[0x7bff], 65504.0f);
}

TEST(ProbeSet, Fp32IsCopiedBitForBit) {
  const std::vector<float> w = {-0.0f, std::numeric_limits<float>::denorm_min(),
                                std::numeric_limits<float>::max(), -1.5f};
  absl::StatusOr<std::shared_ptr<ProbeSet>> set =
      LoadTensors({{"weight", "F32", {2, 2}, Encode(w, "F32")},
                   {"bias", "F32", {2}, Encode({1.0f, -1.0f}, "F32")}});
  ASSERT_TRUE(set.ok()) << set.status();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(SameBits((*set)->weight[i], w[i])) << i;
}

// ---- Contract violations ------------------------------------------------------------------------

TEST(ProbeSetRefuse, Tensors) {
  const std::string w = Encode({1, 2, 3, 4}, "F32");
  const std::string b = Encode({1, 2}, "F32");
  EXPECT_TRUE(IsInvalid(LoadTensors({{"bias", "F32", {2}, b}}), "missing tensor \"weight\""));
  EXPECT_TRUE(IsInvalid(LoadTensors({{"weight", "F32", {2, 2}, w}}), "missing tensor \"bias\""));
  EXPECT_TRUE(IsInvalid(LoadTensors({}), "missing tensor \"weight\""));
  EXPECT_TRUE(IsInvalid(LoadTensors({{"weight", "F32", {2, 2}, w},
                                     {"bias", "F32", {2}, b},
                                     {"scale", "F32", {1}, Encode({1}, "F32")}}),
                        "unexpected tensor \"scale\""));
  EXPECT_TRUE(IsInvalid(LoadTensors({{"Weight", "F32", {2, 2}, w}, {"bias", "F32", {2}, b}}),
                        "unexpected tensor \"Weight\""));
}

TEST(ProbeSetRefuse, Dtypes) {
  const std::string b = Encode({1, 2}, "F32");
  EXPECT_TRUE(IsInvalid(
      LoadTensors({{"weight", "I32", {2, 2}, std::string(16, '\0')}, {"bias", "F32", {2}, b}}),
      "tensor \"weight\" has dtype I32; expected F32, F16 or BF16"));
  EXPECT_TRUE(IsInvalid(
      LoadTensors({{"weight", "F64", {2, 2}, std::string(32, '\0')}, {"bias", "F32", {2}, b}}),
      "tensor \"weight\" has dtype F64"));
  EXPECT_TRUE(IsInvalid(LoadTensors({{"weight", "F32", {2, 2}, Encode({1, 2, 3, 4}, "F32")},
                                     {"bias", "U8", {2}, std::string(2, '\0')}}),
                        "tensor \"bias\" has dtype U8"));
}

TEST(ProbeSetRefuse, Shapes) {
  const std::string w4 = Encode({1, 2, 3, 4}, "F32");
  const std::string b2 = Encode({1, 2}, "F32");
  EXPECT_TRUE(IsInvalid(LoadTensors({{"weight", "F32", {4}, w4}, {"bias", "F32", {2}, b2}}),
                        "tensor \"weight\" has shape [4]; expected [P, H]"));
  EXPECT_TRUE(IsInvalid(
      LoadTensors({{"weight", "F32", {1, 2, 2}, w4}, {"bias", "F32", {1}, Encode({1}, "F32")}}),
      "tensor \"weight\" has shape [1, 2, 2]; expected [P, H]"));
  EXPECT_TRUE(IsInvalid(LoadTensors({{"weight", "F32", {2, 2}, w4}, {"bias", "F32", {2, 1}, b2}}),
                        "tensor \"bias\" has shape [2, 1]; expected [P]"));
  EXPECT_TRUE(IsInvalid(
      LoadTensors({{"weight", "F32", {2, 2}, w4}, {"bias", "F32", {}, Encode({1}, "F32")}}),
      "tensor \"bias\" has shape []; expected [P]"));
  EXPECT_TRUE(IsInvalid(LoadTensors({{"weight", "F32", {2, 2}, w4}, {"bias", "F32", {4}, w4}}),
                        "tensor \"bias\" has 4 entries but \"weight\" has 2 probes"));
  EXPECT_TRUE(IsInvalid(LoadTensors({{"weight", "F32", {0, 4}, ""}, {"bias", "F32", {0}, ""}}),
                        "has 0 probes"));
  EXPECT_TRUE(IsInvalid(LoadTensors({{"weight", "F32", {2, 0}, ""}, {"bias", "F32", {2}, b2}}),
                        "has hidden size 0"));
}

TEST(ProbeSetRefuse, Limits) {
  ProbeSetLimits limits;
  limits.max_probes = 2;
  EXPECT_TRUE(IsRefused(LoadBytes(ProbeFile{}.Bytes(), limits), StatusCode::kResourceExhausted,
                        "tensor \"weight\" has 3 probes, over the limit of 2"));
  limits = {};
  limits.max_hidden = 3;
  EXPECT_TRUE(IsRefused(LoadBytes(ProbeFile{}.Bytes(), limits), StatusCode::kResourceExhausted,
                        "tensor \"weight\" has hidden size 4, over the limit of 3"));
  limits = {};
  limits.file.max_file_bytes = 64;
  EXPECT_TRUE(IsRefused(LoadBytes(ProbeFile{}.Bytes(), limits), StatusCode::kResourceExhausted,
                        "over the limit of 64"));
}

// The metadata parser's error quotes the value's bytes escaped, like the header's (the defect
// fuzz_safetensors found in the header: DEL and the bytes around it went into the message raw).
TEST(ProbeSetRefuse, MetadataJsonErrorQuotesTheValueEscaped) {
  const absl::StatusOr<std::shared_ptr<ProbeSet>> set =
      LoadWithMetadata({{"probe_names", "[\"a\x7f"}});
  ASSERT_TRUE(IsInvalid(set, "metadata \"probe_names\" is not valid JSON"));
  EXPECT_FALSE(absl::StrContains(set.status().message(), "\x7f")) << set.status();
  EXPECT_TRUE(absl::StrContains(set.status().message(), R"(\x7f)")) << set.status();
}

TEST(ProbeSetRefuse, ProbeNames) {
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"probe_names", "[\"a\", \"b\""}}),
                        "metadata \"probe_names\" is not valid JSON"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"probe_names", "a,b,c"}}),
                        "metadata \"probe_names\" is not valid JSON"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"probe_names", R"({"a":1})"}}),
                        "metadata \"probe_names\" is not a JSON array (object)"));
  EXPECT_TRUE(
      IsInvalid(LoadWithMetadata({{"probe_names", R"("abc")"}}), "is not a JSON array (string)"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"probe_names", R"(["a","b"])"}}),
                        "metadata \"probe_names\" has 2 entries but weight has 3 probes"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"probe_names", R"(["a","b","c","d"])"}}),
                        "has 4 entries but weight has 3 probes"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"probe_names", R"(["a",2,"c"])"}}),
                        "probe_names[1] is not a string (number)"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"probe_names", R"(["a","b",null])"}}),
                        "probe_names[2] is not a string (null)"));
  EXPECT_TRUE(
      IsInvalid(LoadWithMetadata({{"probe_names", R"(["a","","c"])"}}), "probe_names[1] is empty"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"probe_names", R"(["a","b","a"])"}}),
                        "probe_names[2] \"a\" duplicates probe_names[0]"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"probe_names", R"(["a",["b"],"c"])"}}),
                        "metadata \"probe_names\" has a nested array or object"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"probe_names", std::string(100000, '[')}}),
                        "has a nested array or object"));
  // nlohmann alone would stop at the NUL and accept the array before it.
  EXPECT_TRUE(
      IsInvalid(LoadWithMetadata({{"probe_names", std::string("[\"a\",\"b\",\"c\"]\0junk", 18)}}),
                "metadata \"probe_names\" contains a NUL character"));
}

TEST(ProbeSetRefuse, Activation) {
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"activation", "relu"}}),
                        "metadata \"activation\" is \"relu\"; expected \"none\" or \"sigmoid\""));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"activation", "Sigmoid"}}), "is \"Sigmoid\""));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"activation", ""}}), "is \"\""));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"activation", "\"sigmoid\""}}), "activation"));
}

TEST(ProbeSet, ScoreBucketBounds) {
  auto bounds = [](const std::map<std::string, std::string>& metadata) {
    absl::StatusOr<std::shared_ptr<ProbeSet>> set = LoadWithMetadata(metadata);
    EXPECT_TRUE(set.ok()) << set.status();
    return set.ok() ? (*set)->score_bounds : std::vector<float>{};
  };
  // Sigmoid: 0.05 ... 1, whatever the thresholds.
  const std::vector<float> sigmoid =
      bounds({{"activation", "sigmoid"}, {"thresholds", "[0.9, null, 0.2]"}});
  ASSERT_EQ(sigmoid.size(), 20u);
  EXPECT_FLOAT_EQ(sigmoid.front(), 0.05f);
  EXPECT_FLOAT_EQ(sigmoid[9], 0.5f);
  EXPECT_EQ(sigmoid.back(), 1.0f);
  // Raw scores without thresholds: -9 ... 10.
  const std::vector<float> raw = bounds({});
  ASSERT_EQ(raw.size(), 20u);
  EXPECT_EQ(raw.front(), -9.0f);
  EXPECT_EQ(raw.back(), 10.0f);
  // One threshold t: [t - 1, t + 1] in twentieths, t the middle bound.
  const std::vector<float> one = bounds({{"thresholds", "[2, null, 2]"}});
  ASSERT_EQ(one.size(), 20u);
  EXPECT_FLOAT_EQ(one.front(), 1.1f);
  EXPECT_FLOAT_EQ(one[9], 2.0f);
  EXPECT_FLOAT_EQ(one.back(), 3.0f);
  // Several: [lo - w, hi + w], w = hi - lo.
  const std::vector<float> spread = bounds({{"thresholds", "[-2, 4, null]"}});
  ASSERT_EQ(spread.size(), 20u);
  EXPECT_FLOAT_EQ(spread.front(), -8.0f + 0.9f);
  EXPECT_FLOAT_EQ(spread.back(), 10.0f);
  // Thresholds near float's range: only finite, ascending bounds.
  const std::vector<float> huge = bounds({{"thresholds", "[0.1, 3.4e38, 1e-50]"}});
  EXPECT_FALSE(huge.empty());
  for (size_t i = 0; i < huge.size(); ++i) {
    EXPECT_TRUE(std::isfinite(huge[i]));
    if (i > 0) {
      EXPECT_GT(huge[i], huge[i - 1]);
    }
  }
  // The metadata's own, as given.
  EXPECT_EQ(bounds({{"activation", "sigmoid"}, {"score_buckets", "[0.1, 0.5, 0.9, 0.99]"}}),
            (std::vector<float>{0.1f, 0.5f, 0.9f, 0.99f}));
  EXPECT_EQ(bounds({{"score_buckets", "[-1e3, 0, 7]"}}), (std::vector<float>{-1000, 0, 7}));
  // ThresholdsOrNaN: one per probe.
  absl::StatusOr<std::shared_ptr<ProbeSet>> set =
      LoadWithMetadata({{"thresholds", "[1, null, 3]"}});
  ASSERT_TRUE(set.ok());
  const std::vector<float> thresholds = ThresholdsOrNaN(**set);
  ASSERT_EQ(thresholds.size(), 3u);
  EXPECT_EQ(thresholds[0], 1.0f);
  EXPECT_TRUE(std::isnan(thresholds[1]));
  EXPECT_EQ(thresholds[2], 3.0f);
}

TEST(ProbeSetRefuse, ScoreBuckets) {
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"score_buckets", "[]"}}),
                        "metadata \"score_buckets\" has 0 entries; expected 1 to 32"));
  std::string many = "[";
  for (int i = 0; i < 33; ++i) absl::StrAppend(&many, i ? ", " : "", i);
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"score_buckets", many + "]"}}), "has 33 entries"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"score_buckets", "[0.5, 0.5]"}}),
                        "score_buckets[1] = 0.5 is not above the entry before it"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"score_buckets", "[0.5, 0.1]"}}), "score_buckets[1]"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"score_buckets", "[0.5, null]"}}),
                        "score_buckets[1] is not a number (null)"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"score_buckets", "[1e39]"}}),
                        "score_buckets[0] = 1e+39 is not a finite float"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"score_buckets", "0.5"}}), "not a JSON array"));
}

TEST(ProbeSetRefuse, Thresholds) {
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"thresholds", "[0.5, 0.5]"}}),
                        "metadata \"thresholds\" has 2 entries but weight has 3 probes"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"thresholds", "0.5"}}),
                        "metadata \"thresholds\" is not a JSON array (number)"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"thresholds", "[0.5, \"0.5\", null]"}}),
                        "thresholds[1] is neither a number nor null (string)"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"thresholds", "[0.5, true, null]"}}),
                        "thresholds[1] is neither a number nor null (boolean)"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"thresholds", "[0.5, null, 1e39]"}}),
                        "thresholds[2] = 1e+39 is not a finite float"));
  EXPECT_TRUE(
      IsInvalid(LoadWithMetadata({{"thresholds", "[-1e39, null, null]"}}), "thresholds[0]"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"thresholds", "[1e400, null, null]"}}), "thresholds"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"thresholds", "[NaN, null, null]"}}),
                        "metadata \"thresholds\" is not valid JSON"));
  EXPECT_TRUE(IsInvalid(LoadWithMetadata({{"thresholds", "[[0.5], null, null]"}}),
                        "metadata \"thresholds\" has a nested array or object"));
}

TEST(ProbeSetRefuse, NonFiniteWeights) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  ProbeFile file;
  file.weight.assign(12, 0.5f);
  file.weight[1 * 4 + 2] = nan;
  EXPECT_TRUE(IsInvalid(LoadBytes(file.Bytes()), "weight[1, 2] is not finite (nan)"));
  file.weight_dtype = "BF16";
  file.weight[1 * 4 + 2] = 0.5f;
  file.weight[2 * 4 + 3] = -inf;
  EXPECT_TRUE(IsInvalid(LoadBytes(file.Bytes()), "weight[2, 3] is not finite (-inf)"));
  file.weight_dtype = "F16";
  file.weight[2 * 4 + 3] = 0.5f;
  file.weight[0] = 1e6f;  // overflows fp16 to +inf
  EXPECT_TRUE(IsInvalid(LoadBytes(file.Bytes()), "weight[0, 0] is not finite (inf)"));

  ProbeFile bias_file;
  bias_file.bias = {0.0f, nan, 0.0f};
  EXPECT_TRUE(IsInvalid(LoadBytes(bias_file.Bytes()), "bias[1] is not finite (nan)"));
  bias_file.bias_dtype = "BF16";
  bias_file.bias = {0.0f, 0.0f, inf};
  EXPECT_TRUE(IsInvalid(LoadBytes(bias_file.Bytes()), "bias[2] is not finite (inf)"));
}

TEST(ProbeSetRefuse, BadSetName) {
  EXPECT_TRUE(IsInvalid(LoadBytes(ProbeFile{}.Bytes(), {}, "a/b"), "invalid character at 1"));
  EXPECT_TRUE(IsInvalid(LoadBytes(ProbeFile{}.Bytes(), {}, ""), "probe set name is empty"));
}

TEST(ProbeSetName, Validation) {
  for (const char* good : {"a", "demo", "A-z_0.9", "probe.set-v2_final", "..", "0"}) {
    EXPECT_TRUE(ValidateProbeSetName(good).ok()) << good;
  }
  EXPECT_TRUE(ValidateProbeSetName(std::string(128, 'n')).ok());
  struct Case {
    std::string name;
    std::string fragment;
  };
  const Case kBad[] = {
      {"", "probe set name is empty"},
      {std::string(129, 'n'), "probe set name is 129 characters, over the limit of 128"},
      {"a b", "invalid character at 1"},
      {"a/b", "invalid character at 1"},
      {"x\xc3\xa9", "invalid character at 1"},
      {std::string("ab\0c", 4), "invalid character at 2"},
      {"tab\t", "\"tab\\x09\" has an invalid character at 3"},
      {"semi;colon", "invalid character at 4"},
  };
  for (const Case& c : kBad) {
    const absl::Status status = ValidateProbeSetName(c.name);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_TRUE(absl::StrContains(status.message(), c.fragment)) << status;
  }
}

// ---- Files written by the Python safetensors package -------------------------------------------

std::string FixturesDir() {
  const char* dir = std::getenv("PROBE_SIDECAR_SAFETENSORS_FIXTURES");
  return dir == nullptr ? "" : dir;
}

class PythonProbeFixturesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (FixturesDir().empty()) {
      GTEST_SKIP() << "PROBE_SIDECAR_SAFETENSORS_FIXTURES is not set (run through ctest)";
    }
    std::ifstream in(FixturesDir() + "/manifest.json");
    manifest_ = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(manifest_.is_object()) << "cannot read " << FixturesDir() << "/manifest.json";
  }

  // Loads the fixture and checks weight and bias against the values the script recorded.
  std::shared_ptr<ProbeSet> LoadAndCheckValues(const std::string& filename) {
    absl::StatusOr<common::SafetensorsFile> file =
        common::SafetensorsFile::Read(FixturesDir() + "/" + filename, ProbeSetLimits{}.file);
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return nullptr;
    absl::StatusOr<std::shared_ptr<ProbeSet>> set =
        ProbeSetFromSafetensors("fixture", *file, filename, {});
    EXPECT_TRUE(set.ok()) << set.status();
    if (!set.ok()) return nullptr;
    const nlohmann::json& tensors = manifest_["files"][filename]["tensors"];
    const auto weight = tensors["weight"]["values"].get<std::vector<double>>();
    const auto bias = tensors["bias"]["values"].get<std::vector<double>>();
    EXPECT_EQ((*set)->weight.size(), weight.size());
    EXPECT_EQ((*set)->bias.size(), bias.size());
    for (size_t i = 0; i < weight.size() && i < (*set)->weight.size(); ++i) {
      EXPECT_EQ((*set)->weight[i], static_cast<float>(weight[i])) << filename << " weight " << i;
      EXPECT_EQ(static_cast<double>((*set)->weight[i]), weight[i]) << "not exact in float32";
    }
    for (size_t i = 0; i < bias.size() && i < (*set)->bias.size(); ++i) {
      EXPECT_EQ(static_cast<double>((*set)->bias[i]), bias[i]) << filename << " bias " << i;
    }
    EXPECT_EQ((*set)->source, filename);
    return *std::move(set);
  }

  nlohmann::json manifest_;
};

TEST_F(PythonProbeFixturesTest, Fp32) {
  std::shared_ptr<ProbeSet> set = LoadAndCheckValues("probe_fp32.safetensors");
  ASSERT_NE(set, nullptr);
  EXPECT_EQ(set->num_probes, 3);
  EXPECT_EQ(set->hidden, 8);
  EXPECT_EQ(set->weight_dtype, DType::kFloat32);
  EXPECT_EQ(set->activation, kernels::Activation::kSigmoid);
  EXPECT_EQ(set->probes[0].name, "toxicity");
  EXPECT_EQ(set->probes[2].name, "pii");
  EXPECT_EQ(set->probes[0].threshold, 0.25f);
  EXPECT_FALSE(set->probes[1].threshold.has_value());
  EXPECT_EQ(set->probes[2].threshold, -1.5f);
}

TEST_F(PythonProbeFixturesTest, Fp16WithFp32Bias) {
  std::shared_ptr<ProbeSet> set = LoadAndCheckValues("probe_fp16.safetensors");
  ASSERT_NE(set, nullptr);
  EXPECT_EQ(set->weight_dtype, DType::kFloat16);
  EXPECT_EQ(set->activation, kernels::Activation::kNone);
  EXPECT_EQ(set->probes[1].name, "beta");
}

TEST_F(PythonProbeFixturesTest, Bf16) {
  std::shared_ptr<ProbeSet> set = LoadAndCheckValues("probe_bf16.safetensors");
  ASSERT_NE(set, nullptr);
  EXPECT_EQ(set->weight_dtype, DType::kBFloat16);
  EXPECT_EQ(set->num_probes, 4);
  EXPECT_EQ(set->hidden, 32);
  EXPECT_EQ(set->probes[2].threshold, 0.9f);
  EXPECT_FALSE(set->probes[3].threshold.has_value());
}

TEST_F(PythonProbeFixturesTest, TorchStyleMetadataGivesDefaults) {
  std::shared_ptr<ProbeSet> set = LoadAndCheckValues("probe_torch_style.safetensors");
  ASSERT_NE(set, nullptr);
  EXPECT_EQ(set->activation, kernels::Activation::kNone);
  EXPECT_EQ(set->probes[0].name, "probe_0");
  EXPECT_EQ(set->probes[1].name, "probe_1");
  EXPECT_FALSE(set->probes[0].threshold.has_value());
}

TEST_F(PythonProbeFixturesTest, GenericFilesAreNotProbeSets) {
  absl::StatusOr<common::SafetensorsFile> file =
      common::SafetensorsFile::Read(FixturesDir() + "/st_multi_dtype.safetensors", {});
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::shared_ptr<ProbeSet>> set = ProbeSetFromSafetensors("x", *file, "f", {});
  EXPECT_TRUE(IsInvalid(set, "unexpected tensor"));
}

// make-demo-probe-set's output, checked by the fixture script with safetensors and left there.
TEST_F(PythonProbeFixturesTest, DemoProbeSet) {
  // The file the build bundles (generated by make-demo-probe-set).
  const std::string path = PROBESIDECAR_DEMO_PROBE_SET;
  absl::StatusOr<common::SafetensorsFile> file = common::SafetensorsFile::Read(path, {});
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::shared_ptr<ProbeSet>> set = ProbeSetFromSafetensors("demo", *file, path, {});
  ASSERT_TRUE(set.ok()) << set.status();
  const ProbeSet& s = **set;
  EXPECT_EQ(s.num_probes, 4);
  EXPECT_EQ(s.hidden, 4096);
  EXPECT_EQ(s.weight_dtype, DType::kBFloat16);
  EXPECT_EQ(s.activation, kernels::Activation::kSigmoid);
  const char* kNames[] = {"probe_a", "probe_b", "probe_c", "probe_d"};
  const std::optional<float> kThresholds[] = {0.5f, 0.5f, 0.9f, std::nullopt};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(s.probes[i].name, kNames[i]);
    EXPECT_EQ(s.probes[i].threshold, kThresholds[i]);
  }
  double sum_sq = 0.0;
  for (float w : s.weight) sum_sq += static_cast<double>(w) * w;
  const double rms = std::sqrt(sum_sq / static_cast<double>(s.weight.size()));
  EXPECT_NEAR(rms, 1.0 / 64.0, 0.1 / 64.0);
  for (float b : s.bias) EXPECT_LT(std::abs(b), 0.1f);
}

}  // namespace
}  // namespace probesidecar::server
