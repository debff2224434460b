#include "common/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace probesidecar::common {
namespace {

using ::absl::StatusCode;

std::string Le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// 8-byte length + header + data, exactly as given (no padding): the hostile cases need control.
std::string RawFile(absl::string_view header, absl::string_view data) {
  return absl::StrCat(Le64(header.size()), header, data);
}

// A tensor entry for a hand-written header.
std::string Entry(absl::string_view name, absl::string_view dtype, absl::string_view shape,
                  uint64_t begin, uint64_t end) {
  return absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape,
                      ",\"data_offsets\":[", begin, ",", end, "]}");
}

// Two tensors, 11 data bytes: "a" F32 [2] then "b" U8 [3].
std::string ValidHeader() {
  return absl::StrCat("{", Entry("a", "F32", "[2]", 0, 8), ",", Entry("b", "U8", "[3]", 8, 11),
                      "}");
}
std::string ValidData() { return std::string("\x00\x00\x80\x3f\x00\x00\x00\x40\x01\x02\x03", 11); }
std::string ValidFile() { return RawFile(ValidHeader(), ValidData()); }

absl::StatusOr<SafetensorsFile> Parse(std::string bytes, SafetensorsLimits limits = {}) {
  return SafetensorsFile::Parse(std::move(bytes), limits);
}

::testing::AssertionResult IsRefused(const absl::StatusOr<SafetensorsFile>& result, StatusCode code,
                                     absl::string_view fragment) {
  if (result.ok()) return ::testing::AssertionFailure() << "accepted, expected " << code;
  if (result.status().code() != code || !absl::StrContains(result.status().message(), fragment)) {
    return ::testing::AssertionFailure() << "got " << result.status() << "; expected " << code
                                         << " containing \"" << fragment << "\"";
  }
  return ::testing::AssertionSuccess() << result.status();
}

::testing::AssertionResult IsInvalid(const absl::StatusOr<SafetensorsFile>& result,
                                     absl::string_view fragment) {
  return IsRefused(result, StatusCode::kInvalidArgument, fragment);
}

// Every parsed tensor's bytes lie inside the file (what the fuzz loop checks on accepted inputs).
void ExpectSpansInside(const SafetensorsFile& file) {
  for (const SafetensorsTensor& t : file.tensors()) {
    absl::Span<const uint8_t> data = file.Data(t);
    ASSERT_EQ(data.size(), t.data_end - t.data_begin);
    ASSERT_LE(t.data_end, file.file_bytes());
  }
}

// ---- Accepted files ---------------------------------------------------------------------------

TEST(SafetensorsParse, ValidFile) {
  absl::StatusOr<SafetensorsFile> file = Parse(ValidFile());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors().size(), 2u);
  const SafetensorsTensor* a = file->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, "F32");
  EXPECT_EQ(a->shape, std::vector<int64_t>{2});
  absl::Span<const uint8_t> a_data = file->Data(*a);
  ASSERT_EQ(a_data.size(), 8u);
  float values[2];
  std::memcpy(values, a_data.data(), 8);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], 2.0f);
  const SafetensorsTensor* b = file->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(std::vector<uint8_t>(file->Data(*b).begin(), file->Data(*b).end()),
            (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(file->Find("c"), nullptr);
  EXPECT_EQ(file->Find(""), nullptr);
  EXPECT_TRUE(file->metadata().empty());
  EXPECT_EQ(file->file_bytes(), ValidFile().size());
}

TEST(SafetensorsParse, AcceptsScalarsZeroSizedTensorsAndWhitespace) {
  // A scalar (shape []), zero-byte tensors at the start, middle and end, spaces around the JSON
  // and an unpadded header.
  const std::string header =
      absl::StrCat("  {", Entry("z0", "F32", "[0]", 0, 0), ",", Entry("s", "F64", "[]", 0, 8), ",",
                   Entry("z1", "I32", "[4,0,2]", 8, 8), ",", Entry("t", "I8", "[1]", 8, 9), ",",
                   Entry("z2", "BOOL", "[0]", 9, 9), "}   ");
  absl::StatusOr<SafetensorsFile> file = Parse(RawFile(header, std::string(9, '\x07')));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors().size(), 5u);
  EXPECT_TRUE(file->Find("s")->shape.empty());
  EXPECT_EQ(file->Data(*file->Find("s")).size(), 8u);
  EXPECT_EQ(file->Data(*file->Find("z1")).size(), 0u);
}

TEST(SafetensorsParse, AcceptsNoTensors) {
  absl::StatusOr<SafetensorsFile> file = Parse(RawFile("{}      ", ""));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors().empty());
  file = Parse(RawFile(R"({"__metadata__":{"k":"v"}})", ""));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("k"), "v");
}

TEST(SafetensorsParse, MetadataAndUnicodeNames) {
  const std::string header =
      absl::StrCat(R"({"__metadata__":{"format":"pt","note":"a\nb \u00e9 \ud83d\ude00"},)",
                   Entry("gr\xc3\xbc\xc3\x9f"
                         "e",
                         "U8", "[1]", 0, 1),
                   "}");
  absl::StatusOr<SafetensorsFile> file = Parse(RawFile(header, "x"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().size(), 2u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "a\nb \xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_NE(file->Find("gr\xc3\xbc\xc3\x9f"
                       "e"),
            nullptr);
}

TEST(SafetensorsParse, LimitsAreInclusive) {
  SafetensorsLimits limits;
  limits.max_tensors = 2;
  limits.max_header_bytes = ValidHeader().size();
  limits.max_file_bytes = ValidFile().size();
  limits.max_rank = 1;
  limits.max_json_depth = 3;
  EXPECT_TRUE(Parse(ValidFile(), limits).ok());
}

TEST(SafetensorsDType, Sizes) {
  const std::pair<const char*, int> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  for (const auto& [name, size] : kSizes) EXPECT_EQ(SafetensorsDTypeSize(name), size) << name;
  for (const char* unknown : {"", "f32", "F128", "FLOAT", "F8", "C64", "BF16 "}) {
    EXPECT_EQ(SafetensorsDTypeSize(unknown), 0) << unknown;
  }
}

// ---- Refusals: framing ------------------------------------------------------------------------

TEST(SafetensorsRefuse, ShorterThanLengthField) {
  for (size_t n = 0; n < 8; ++n) {
    EXPECT_TRUE(IsInvalid(Parse(std::string(n, '\0')), "shorter than the 8-byte header length"))
        << n;
  }
}

TEST(SafetensorsRefuse, HeaderLengthZero) {
  EXPECT_TRUE(IsInvalid(Parse(Le64(0) + "{}"), "header length is 0"));
}

TEST(SafetensorsRefuse, HeaderLengthOverLimit) {
  SafetensorsLimits limits;
  limits.max_header_bytes = 16;
  EXPECT_TRUE(IsRefused(
      Parse(ValidFile(), limits), StatusCode::kResourceExhausted,
      absl::StrCat("header length ", ValidHeader().size(), " is over the limit of 16 bytes")));
}

TEST(SafetensorsRefuse, HeaderLengthPastEndOfFile) {
  EXPECT_TRUE(IsInvalid(Parse(Le64(100) + "{}"),
                        "header length 100 runs past the end of the file (2 bytes follow"));
  // A length field that cannot fit is malformed, whatever the limit; no overflow either.
  EXPECT_TRUE(IsInvalid(Parse(Le64(~uint64_t{0}) + "{}"),
                        "header length 18446744073709551615 runs past the end"));
  SafetensorsLimits limits;
  limits.max_header_bytes = ~uint64_t{0};
  EXPECT_TRUE(IsInvalid(Parse(Le64(~uint64_t{0} - 7) + "{}", limits), "runs past the end"));
  // Not a safetensors file at all.
  EXPECT_TRUE(IsInvalid(Parse("<!DOCTYPE html><html></html>"), "runs past the end"));
}

TEST(SafetensorsRefuse, FileOverLimit) {
  SafetensorsLimits limits;
  limits.max_file_bytes = ValidFile().size() - 1;
  EXPECT_TRUE(
      IsRefused(Parse(ValidFile(), limits), StatusCode::kResourceExhausted, "over the limit of"));
}

// ---- Refusals: header JSON --------------------------------------------------------------------

TEST(SafetensorsRefuse, InvalidUtf8) {
  for (std::string bad : {std::string("\xff"), std::string("\xc0\xaf"),  // overlong '/'
                          std::string("\xed\xa0\x80"),                   // surrogate
                          std::string("\xf4\x90\x80\x80"),               // > U+10FFFF
                          std::string("\xe2\x82")}) {                    // truncated
    const std::string header = absl::StrCat("{", Entry("a" + bad, "U8", "[1]", 0, 1), "}");
    EXPECT_TRUE(
        IsInvalid(Parse(RawFile(header, "x")), "header is not valid UTF-8 (at header byte 3)"));
  }
}

TEST(SafetensorsRefuse, NotJson) {
  EXPECT_TRUE(IsInvalid(Parse(RawFile("{not json}", "")), "header is not valid JSON"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile("{} x", "")), "header is not valid JSON"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile("        ", "")), "header is not valid JSON"));
  // nlohmann alone would stop at the NUL and accept this.
  EXPECT_TRUE(IsInvalid(Parse(RawFile(std::string("{}\0\0\0\0\0\0", 8), "")),
                        "header contains a NUL byte (at header byte 2)"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile("{/*c*/}", "")), "not valid JSON"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile(R"({"a\ud800":1})", "")), "not valid JSON"));
}

// Found by fuzz_safetensors (tests/fuzz/safetensors/regressions/json-error-echoes-del): the JSON
// parser's message quotes the header bytes it last read, escaping only those below 0x20, so a DEL
// (and the bytes around it) went into the message raw.
TEST(SafetensorsRefuse, JsonErrorQuotesTheHeaderEscaped) {
  const absl::StatusOr<SafetensorsFile> file = Parse(RawFile("\"N8nlkk\x7fGk", ""));
  ASSERT_TRUE(IsInvalid(file, "header is not valid JSON"));
  EXPECT_FALSE(absl::StrContains(file.status().message(), "\x7f")) << file.status();
  EXPECT_TRUE(absl::StrContains(file.status().message(), R"(last read: "\"N8nlkk\x7fGk")"))
      << file.status();
  // A long token is cut like any other quoted text.
  const absl::StatusOr<SafetensorsFile> long_token =
      Parse(RawFile(absl::StrCat("\"", std::string(500, 'a')), ""));
  EXPECT_LT(long_token.status().message().size(), 300u) << long_token.status();
}

TEST(SafetensorsRefuse, NotAnObject) {
  EXPECT_TRUE(IsInvalid(Parse(RawFile("[]", "")), "header is not a JSON object (array)"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile("\"x\"", "")), "header is not a JSON object (string)"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile("12", "")), "header is not a JSON object (number)"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile("null", "")), "header is not a JSON object (null)"));
}

TEST(SafetensorsRefuse, NestedTooDeep) {
  // Top object 1, "__metadata__" 2, then 7 arrays: 9 levels.
  EXPECT_TRUE(IsInvalid(Parse(RawFile(R"({"__metadata__":{"k":[[[[[[[1]]]]]]]}})", "")),
                        "nested deeper than 8 levels in \"__metadata__\""));
  // A hostile depth is refused early, without recursion or a deep DOM.
  EXPECT_TRUE(IsInvalid(Parse(RawFile(std::string(1 << 20, '['), "")), "nested deeper than 8"));
  EXPECT_TRUE(IsInvalid(
      Parse(RawFile(absl::StrCat(R"({"a":{"dtype":"U8","shape":)", std::string(100000, '['), ""),
                    "")),
      "nested deeper than 8 levels in tensor \"a\""));
  SafetensorsLimits limits;
  limits.max_json_depth = 2;  // a valid file needs 3 (object, tensor object, shape array)
  EXPECT_TRUE(IsInvalid(Parse(ValidFile(), limits), "nested deeper than 2 levels"));
}

TEST(SafetensorsRefuse, DuplicateKeys) {
  const std::string a = Entry("a", "U8", "[1]", 0, 1);
  EXPECT_TRUE(IsInvalid(Parse(RawFile(absl::StrCat("{", a, ",", a, "}"), "x")),
                        "header has a duplicate key \"a\""));
  EXPECT_TRUE(IsInvalid(
      Parse(RawFile(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x")),
      "duplicate key \"dtype\" in tensor \"a\""));
  EXPECT_TRUE(
      IsInvalid(Parse(RawFile(absl::StrCat(R"({"__metadata__":{"k":"1","k":"2"},)", a, "}"), "x")),
                "duplicate key \"k\" in \"__metadata__\""));
  EXPECT_TRUE(IsInvalid(
      Parse(RawFile(absl::StrCat(R"({"__metadata__":{},"__metadata__":{},)", a, "}"), "x")),
      "duplicate key \"__metadata__\""));
}

TEST(SafetensorsRefuse, TooManyTensors) {
  SafetensorsLimits limits;
  limits.max_tensors = 1;
  EXPECT_TRUE(
      IsRefused(Parse(ValidFile(), limits), StatusCode::kResourceExhausted, "more than 1 tensors"));
  // Thousands of entries stop at the limit instead of being parsed in full.
  std::string header = "{";
  for (int i = 0; i < 5000; ++i) absl::StrAppend(&header, i ? "," : "", "\"t", i, "\":{}");
  header += "}";
  EXPECT_TRUE(IsRefused(Parse(RawFile(header, "")), StatusCode::kResourceExhausted,
                        "more than 4096 tensors"));
}

// ---- Refusals: tensor entries -----------------------------------------------------------------

TEST(SafetensorsRefuse, EntryNotAnObject) {
  EXPECT_TRUE(
      IsInvalid(Parse(RawFile(R"({"a":5})", "")), "tensor \"a\" is not an object (number)"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile(R"({"a":[0,1]})", "")), "tensor \"a\" is not an object"));
}

TEST(SafetensorsRefuse, MissingOrExtraFields) {
  EXPECT_TRUE(IsInvalid(Parse(RawFile(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", "x")),
                        "tensor \"a\" is missing the field \"dtype\""));
  EXPECT_TRUE(IsInvalid(Parse(RawFile(R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", "x")),
                        "tensor \"a\" is missing the field \"shape\""));
  EXPECT_TRUE(IsInvalid(Parse(RawFile(R"({"a":{"dtype":"U8","shape":[1]}})", "x")),
                        "tensor \"a\" is missing the field \"data_offsets\""));
  EXPECT_TRUE(IsInvalid(
      Parse(RawFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":0}})", "x")),
      "tensor \"a\" has an unexpected field \"x\""));
}

TEST(SafetensorsRefuse, BadDtype) {
  EXPECT_TRUE(
      IsInvalid(Parse(RawFile(absl::StrCat("{", Entry("a", "F128", "[1]", 0, 1), "}"), "x")),
                "tensor \"a\" has an unknown dtype \"F128\""));
  EXPECT_TRUE(IsInvalid(Parse(RawFile(absl::StrCat("{", Entry("a", "u8", "[1]", 0, 1), "}"), "x")),
                        "unknown dtype \"u8\""));
  EXPECT_TRUE(
      IsInvalid(Parse(RawFile(R"({"a":{"dtype":1,"shape":[1],"data_offsets":[0,1]}})", "x")),
                "tensor \"a\": dtype is not a string (number)"));
}

TEST(SafetensorsRefuse, BadShape) {
  auto with_shape = [](absl::string_view shape, uint64_t end) {
    return Parse(
        RawFile(absl::StrCat("{", Entry("a", "U8", shape, 0, end), "}"), std::string(end, 'x')));
  };
  EXPECT_TRUE(IsInvalid(with_shape("3", 3), "tensor \"a\": shape is not an array (number)"));
  EXPECT_TRUE(IsInvalid(with_shape("{}", 3), "shape is not an array (object)"));
  EXPECT_TRUE(IsInvalid(with_shape("[-3]", 3), "tensor \"a\": shape[0] is negative (-3)"));
  EXPECT_TRUE(IsInvalid(with_shape("[1,3.0]", 3), "tensor \"a\": shape[1] is not an integer"));
  EXPECT_TRUE(IsInvalid(with_shape("[1e0]", 1), "shape[0] is not an integer"));
  EXPECT_TRUE(IsInvalid(with_shape("[\"3\"]", 3), "shape[0] is not an integer (string)"));
  EXPECT_TRUE(IsInvalid(with_shape("[true]", 1), "shape[0] is not an integer (boolean)"));
  EXPECT_TRUE(IsInvalid(with_shape("[[3]]", 3), "shape[0] is not an integer (array)"));
  EXPECT_TRUE(IsInvalid(with_shape("[9223372036854775808]", 0),
                        "shape[0] = 9223372036854775808 is too large"));
  EXPECT_TRUE(IsInvalid(with_shape("[99999999999999999999]", 0), "shape[0] is not an integer"));
  EXPECT_TRUE(IsRefused(with_shape("[1,1,1,1,1,1,1,1,1]", 1), StatusCode::kResourceExhausted,
                        "tensor \"a\" has rank 9, over the limit of 8"));
}

TEST(SafetensorsRefuse, BadDataOffsets) {
  auto with_offsets = [](absl::string_view offsets, size_t data) {
    return Parse(
        RawFile(absl::StrCat(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":)", offsets, "}}"),
                std::string(data, 'x')));
  };
  EXPECT_TRUE(
      IsInvalid(with_offsets("4", 4), "tensor \"a\": data_offsets is not an array [begin, end]"));
  EXPECT_TRUE(IsInvalid(with_offsets("[4]", 4), "data_offsets is not an array [begin, end]"));
  EXPECT_TRUE(IsInvalid(with_offsets("[0,4,8]", 4), "data_offsets is not an array [begin, end]"));
  EXPECT_TRUE(
      IsInvalid(with_offsets("[-1,3]", 4), "tensor \"a\": data_offsets[0] is negative (-1)"));
  EXPECT_TRUE(IsInvalid(with_offsets("[0,4.0]", 4), "data_offsets[1] is not an integer"));
  EXPECT_TRUE(IsInvalid(with_offsets("[0,null]", 4), "data_offsets[1] is not an integer (null)"));
  EXPECT_TRUE(IsInvalid(with_offsets("[8,4]", 8), "data_offsets [8, 4] begin after end"));
  EXPECT_TRUE(IsInvalid(with_offsets("[0,5]", 4),
                        "data_offsets [0, 5] run past the end of the 4-byte data section"));
  EXPECT_TRUE(IsInvalid(with_offsets("[18446744073709551612,18446744073709551615]", 4),
                        "run past the end"));
}

TEST(SafetensorsRefuse, ByteCountMismatch) {
  EXPECT_TRUE(IsInvalid(
      Parse(RawFile(absl::StrCat("{", Entry("a", "F32", "[3]", 0, 8), "}"), std::string(8, 'x'))),
      "tensor \"a\": data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile(absl::StrCat("{", Entry("a", "BF16", "[2,2]", 0, 4), "}"),
                                      std::string(4, 'x'))),
                        "shape [2, 2] of BF16 needs 8"));
}

TEST(SafetensorsRefuse, ShapeOverflow) {
  // 2^32 * 2^32 elements: wraps to 0 without overflow checks, which would match [0, 0].
  EXPECT_TRUE(IsInvalid(
      Parse(RawFile(absl::StrCat("{", Entry("a", "U8", "[4294967296,4294967296]", 0, 0), "}"), "")),
      "tensor \"a\": shape [4294967296, 4294967296] of U8 overflows"));
  // Elements fit, bytes do not: 2^62 * 4.
  EXPECT_TRUE(IsInvalid(
      Parse(RawFile(absl::StrCat("{", Entry("a", "F32", "[4611686018427387904]", 0, 0), "}"), "")),
      "overflows 64-bit byte counts"));
  // A zero dimension makes any other dimension harmless.
  EXPECT_TRUE(
      Parse(RawFile(absl::StrCat("{", Entry("a", "F32", "[0,9223372036854775807]", 0, 0), "}"), ""))
          .ok());
}

TEST(SafetensorsRefuse, Misaligned) {
  const std::string header =
      absl::StrCat("{", Entry("a", "U8", "[2]", 0, 2), ",", Entry("b", "F32", "[1]", 2, 6), "}");
  EXPECT_TRUE(IsInvalid(Parse(RawFile(header, std::string(6, 'x'))),
                        "tensor \"b\": data offset 2 is misaligned for F32 (4-byte elements)"));
  // The rule holds for zero-byte tensors too (the reference writer never misaligns one).
  const std::string empty =
      absl::StrCat("{", Entry("a", "U8", "[1]", 0, 1), ",", Entry("b", "BF16", "[0]", 1, 1), "}");
  EXPECT_TRUE(IsInvalid(Parse(RawFile(empty, "x")), "data offset 1 is misaligned for BF16"));
}

TEST(SafetensorsRefuse, Overlap) {
  std::string header =
      absl::StrCat("{", Entry("a", "F32", "[2]", 0, 8), ",", Entry("b", "F32", "[1]", 4, 8), "}");
  EXPECT_TRUE(IsInvalid(Parse(RawFile(header, std::string(8, 'x'))),
                        "tensors \"a\" and \"b\" overlap in the data section (bytes 4 to 8)"));
  // The same range twice.
  header =
      absl::StrCat("{", Entry("a", "F32", "[1]", 0, 4), ",", Entry("b", "F32", "[1]", 0, 4), "}");
  EXPECT_TRUE(IsInvalid(Parse(RawFile(header, std::string(4, 'x'))), "overlap"));
  // A zero-byte tensor inside another one.
  header =
      absl::StrCat("{", Entry("a", "F32", "[2]", 0, 8), ",", Entry("b", "F32", "[0]", 4, 4), "}");
  EXPECT_TRUE(IsInvalid(Parse(RawFile(header, std::string(8, 'x'))), "overlap"));
}

TEST(SafetensorsRefuse, HoleInDataSection) {
  const std::string header =
      absl::StrCat("{", Entry("a", "F32", "[1]", 0, 4), ",", Entry("b", "F32", "[1]", 8, 12), "}");
  EXPECT_TRUE(IsInvalid(Parse(RawFile(header, std::string(12, 'x'))),
                        "the data section has a hole: bytes 4 to 8 (before tensor \"b\")"));
  EXPECT_TRUE(IsInvalid(
      Parse(RawFile(absl::StrCat("{", Entry("a", "F32", "[1]", 4, 8), "}"), std::string(8, 'x'))),
      "hole: bytes 0 to 4"));
}

TEST(SafetensorsRefuse, TrailingBytes) {
  EXPECT_TRUE(IsInvalid(Parse(ValidFile() + "zz"),
                        "the data section has 2 trailing bytes (from offset 11)"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile("{}", "abc")), "3 trailing bytes (from offset 0)"));
}

TEST(SafetensorsRefuse, BadMetadata) {
  const std::string a = Entry("a", "U8", "[1]", 0, 1);
  EXPECT_TRUE(IsInvalid(Parse(RawFile(absl::StrCat(R"({"__metadata__":[],)", a, "}"), "x")),
                        "\"__metadata__\" is not an object (array)"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile(absl::StrCat(R"({"__metadata__":"pt",)", a, "}"), "x")),
                        "\"__metadata__\" is not an object (string)"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile(absl::StrCat(R"({"__metadata__":{"k":1},)", a, "}"), "x")),
                        "\"__metadata__\" value of \"k\" is not a string (number)"));
  EXPECT_TRUE(IsInvalid(Parse(RawFile(absl::StrCat(R"({"__metadata__":{"k":null},)", a, "}"), "x")),
                        "value of \"k\" is not a string (null)"));
  EXPECT_TRUE(
      IsInvalid(Parse(RawFile(absl::StrCat(R"({"__metadata__":{"k":{"x":"y"}},)", a, "}"), "x")),
                "value of \"k\" is not a string (object)"));
}

TEST(SafetensorsRefuse, MessagesQuoteHostileNames) {
  absl::StatusOr<SafetensorsFile> file = Parse(
      RawFile(absl::StrCat(R"({"bad\nname\u0000":5,)", Entry("a", "U8", "[1]", 0, 1), "}"), "x"));
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(absl::StrContains(file.status().message(), R"("bad\x0aname\x00")")) << file.status();
  file = Parse(RawFile(absl::StrCat("{\"", std::string(1000, 'n'), "\":5}"), ""));
  ASSERT_FALSE(file.ok());
  EXPECT_LT(file.status().message().size(), 200u) << file.status();
  EXPECT_TRUE(absl::StrContains(file.status().message(), "(1000 bytes)")) << file.status();
}

TEST(QuoteForMessage, EscapesEverythingThatCanRewriteALine) {
  EXPECT_EQ(QuoteForMessage("plain é ü"), "\"plain é ü\"");
  EXPECT_EQ(QuoteForMessage("a\nb\x1b[2J\x7f\"\\"), R"("a\x0ab\x1b[2J\x7f\"\\")");
  // C1 CSI (U+009B), NEL (U+0085), line separator (U+2028), right-to-left override (U+202E),
  // first strong isolate (U+2068); U+2030 (per mille) and U+00A0 stay as they are.
  EXPECT_EQ(QuoteForMessage("x\xc2\x9b"
                            "31my\xc2\x85"
                            "z"),
            R"("x\u009b31my\u0085z")");
  EXPECT_EQ(QuoteForMessage("a\xe2\x80\xa8"
                            "b\xe2\x80\xae"
                            "c\xe2\x81\xa8"
                            "d"),
            R"("a\u2028b\u202ec\u2068d")");
  EXPECT_EQ(QuoteForMessage("\xe2\x80\xb0\xc2\xa0"), "\"\xe2\x80\xb0\xc2\xa0\"");
  // A truncated sequence at the end is left alone (and cut on a UTF-8 boundary when long).
  EXPECT_EQ(QuoteForMessage("\xc2"), "\"\xc2\"");
}

// ---- Robustness ---------------------------------------------------------------------------------

TEST(SafetensorsRobust, EveryTruncationIsRefused) {
  const std::string with_metadata = WriteSafetensors(
      {{"w", "F32", {2, 3}, std::string(24, '\x01')}, {"b", "BF16", {3}, std::string(6, '\x02')}},
      {{"format", "pt"}});
  for (const std::string& full : {ValidFile(), with_metadata}) {
    ASSERT_TRUE(Parse(full).ok());
    for (size_t n = 0; n < full.size(); ++n) {
      absl::StatusOr<SafetensorsFile> file = Parse(full.substr(0, n));
      EXPECT_FALSE(file.ok()) << "prefix of " << n << " bytes accepted";
      if (!file.ok()) {
        EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument) << file.status();
      }
    }
  }
}

TEST(SafetensorsRobust, RandomByteFlipsNeverCrash) {
  const std::string base =
      WriteSafetensors({{"weight", "BF16", {2, 4}, std::string(16, '\x11')},
                        {"bias", "F32", {2}, std::string(8, '\x22')},
                        {"idx", "I64", {1}, std::string(8, '\x33')},
                        {"empty", "U8", {0}, ""}},
                       {{"probe_names", R"(["a","b"])"}, {"activation", "sigmoid"}});
  ASSERT_TRUE(Parse(base).ok());
  std::mt19937_64 rng(20261129);  // the engine's output is fixed by the standard
  int accepted = 0;
  for (int iteration = 0; iteration < 4000; ++iteration) {
    std::string bytes = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t pos = rng() % bytes.size();
      // Mostly the length field and header, where the parser works; sometimes a whole new byte.
      bytes[pos] = static_cast<char>(iteration % 3 == 0 ? rng() : bytes[pos] ^ (1u << (rng() % 8)));
    }
    if (iteration % 7 == 0) bytes.resize(rng() % (bytes.size() + 8), '}');
    absl::StatusOr<SafetensorsFile> file = Parse(std::move(bytes));
    if (file.ok()) {
      ++accepted;
      ExpectSpansInside(*file);
    } else {
      const StatusCode code = file.status().code();
      EXPECT_TRUE(code == StatusCode::kInvalidArgument || code == StatusCode::kResourceExhausted)
          << file.status();
    }
  }
  // Flipping data bytes keeps the file valid, so some must be accepted.
  EXPECT_GT(accepted, 0);
}

// ---- Read() -------------------------------------------------------------------------------------

class SafetensorsReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/safetensors_read_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::string command = "rm -rf '" + dir_ + "'";
    (void)std::system(command.c_str());
  }
  std::string WriteFile(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::string dir_;
};

TEST_F(SafetensorsReadTest, ReadsAFile) {
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Read(WriteFile("a.safetensors", ValidFile()), {});
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors().size(), 2u);
}

TEST_F(SafetensorsReadTest, MissingFileIsNotFound) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(dir_ + "/nope.safetensors", {});
  EXPECT_TRUE(IsRefused(file, StatusCode::kNotFound, "nope.safetensors\": cannot open"));
  EXPECT_TRUE(IsRefused(SafetensorsFile::Read(dir_ + "/no/such/dir.safetensors", {}),
                        StatusCode::kNotFound, "cannot open"));
  EXPECT_TRUE(IsInvalid(SafetensorsFile::Read("", {}), "empty path"));
}

TEST_F(SafetensorsReadTest, NotARegularFile) {
  EXPECT_TRUE(IsInvalid(SafetensorsFile::Read(dir_, {}), "is not a regular file"));
  const std::string fifo = dir_ + "/fifo.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  // Must neither block waiting for a writer nor read from it.
  EXPECT_TRUE(IsInvalid(SafetensorsFile::Read(fifo, {}), "is not a regular file"));
  EXPECT_TRUE(IsInvalid(SafetensorsFile::Read("/dev/null", {}), "is not a regular file"));
}

TEST_F(SafetensorsReadTest, SizeLimitCheckedBeforeReading) {
  // A sparse 4 GiB file: refused from its size alone (reading it would take seconds).
  const std::string path = WriteFile("big.safetensors", ValidFile());
  ASSERT_EQ(truncate(path.c_str(), int64_t{4} << 30), 0) << std::strerror(errno);
  EXPECT_TRUE(IsRefused(SafetensorsFile::Read(path, {}), StatusCode::kResourceExhausted,
                        "file is 4294967296 bytes, over the limit of 1073741824"));
}

TEST_F(SafetensorsReadTest, MalformedFileNamesThePath) {
  const std::string path = WriteFile("bad.safetensors", ValidFile() + "x");
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(path, {});
  EXPECT_TRUE(IsInvalid(file, "bad.safetensors\": the data section has 1 trailing bytes"));
}

// ---- Writer -------------------------------------------------------------------------------------

TEST(SafetensorsWrite, MatchesTheReferenceLayout) {
  // The reference implementation's own test vector (one F32 tensor [1, 2, 3], no metadata).
  std::string data;
  for (float v : {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f}) {
    data.append(reinterpret_cast<const char*>(&v), 4);
  }
  const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(header.size(), 64u);
  EXPECT_EQ(WriteSafetensors({{"attn.0", "F32", {1, 2, 3}, data}}, {}),
            absl::StrCat(Le64(64), header, data));
  // Empty: "{}" padded with six spaces.
  EXPECT_EQ(WriteSafetensors({}, {}), absl::StrCat(Le64(8), "{}      "));
}

TEST(SafetensorsWrite, RoundTripKeepsEveryTensorAligned) {
  std::vector<SafetensorsTensorToWrite> tensors = {
      {"a_u8", "U8", {3}, "abc"},
      {"b_f32", "F32", {2}, std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8)},
      {"c_bf16", "BF16", {1}, std::string("\x80\x3f", 2)},
      {"d_f64", "F64", {1}, std::string(8, '\x01')},
      {"e_empty", "F16", {0, 4}, ""},
      {"f_scalar", "I32", {}, std::string("\x2a\0\0\0", 4)},
      {"g_bool", "BOOL", {2}, std::string("\x01\x00", 2)},
  };
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"note", "quote \" backslash \\ newline \n tab \t nul-free \x01 \xc3\xa9"}};
  const std::string bytes = WriteSafetensors(tensors, metadata);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u);
  absl::StatusOr<SafetensorsFile> file = Parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata(), metadata);
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (const SafetensorsTensorToWrite& t : tensors) {
    const SafetensorsTensor* read = file->Find(t.name);
    ASSERT_NE(read, nullptr) << t.name;
    EXPECT_EQ(read->dtype, t.dtype);
    EXPECT_EQ(read->shape, t.shape);
    EXPECT_EQ(read->data_begin % SafetensorsDTypeSize(t.dtype), 0u) << t.name;
    absl::Span<const uint8_t> data = file->Data(*read);
    EXPECT_EQ(std::string(data.begin(), data.end()), t.data) << t.name;
  }
  // Data is ordered as the reference writes it: by descending dtype (F64, F32, I32, BF16, F16,
  // U8, BOOL), so every offset is a multiple of its element size.
  const std::pair<const char*, uint64_t> kBegins[] = {
      {"d_f64", 0},    {"b_f32", 8}, {"f_scalar", 16}, {"c_bf16", 20},
      {"e_empty", 22}, {"a_u8", 22}, {"g_bool", 25}};
  for (const auto& [name, begin] : kBegins) EXPECT_EQ(file->Find(name)->data_begin, begin) << name;
  EXPECT_EQ(bytes.size(), 8 + header_bytes + 27);
}

TEST(SafetensorsWrite, IsDeterministicAndOrderIndependent) {
  std::vector<SafetensorsTensorToWrite> tensors = {{"z", "F32", {1}, "abcd"},
                                                   {"a", "F32", {1}, "efgh"}};
  const std::string first = WriteSafetensors(tensors, {{"k", "v"}});
  std::swap(tensors[0], tensors[1]);
  EXPECT_EQ(WriteSafetensors(tensors, {{"k", "v"}}), first);
}

// ---- Files written by the Python safetensors package -------------------------------------------

std::string HexDecode(absl::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

std::string FixturesDir() {
  const char* dir = std::getenv("PROBE_SIDECAR_SAFETENSORS_FIXTURES");
  return dir == nullptr ? "" : dir;
}

nlohmann::json LoadManifest() {
  std::ifstream in(FixturesDir() + "/manifest.json");
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// The element at `index` of a float tensor, as double.
double FloatAt(absl::Span<const uint8_t> data, const std::string& dtype, size_t index) {
  if (dtype == "F64") {
    double v;
    std::memcpy(&v, data.data() + 8 * index, 8);
    return v;
  }
  if (dtype == "F32") {
    float v;
    std::memcpy(&v, data.data() + 4 * index, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, data.data() + 2 * index, 2);
  return dtype == "F16" ? common::HalfToFloat(bits) : common::Bf16ToFloat(bits);
}

class PythonFixturesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (FixturesDir().empty()) {
      GTEST_SKIP() << "PROBE_SIDECAR_SAFETENSORS_FIXTURES is not set (run through ctest)";
    }
    manifest_ = LoadManifest();
    ASSERT_TRUE(manifest_.is_object()) << "cannot read " << FixturesDir() << "/manifest.json";
    ASSERT_GE(manifest_["files"].size(), 5u);
  }
  nlohmann::json manifest_;
};

TEST_F(PythonFixturesTest, ReaderAgreesWithPython) {
  for (const auto& [filename, expected] : manifest_["files"].items()) {
    SCOPED_TRACE(filename);
    absl::StatusOr<SafetensorsFile> file =
        SafetensorsFile::Read(FixturesDir() + "/" + filename, {});
    ASSERT_TRUE(file.ok()) << file.status();
    const auto metadata = expected["metadata"].get<std::map<std::string, std::string>>();
    EXPECT_EQ(file->metadata(), metadata);
    ASSERT_EQ(file->tensors().size(), expected["tensors"].size());
    for (const auto& [name, info] : expected["tensors"].items()) {
      SCOPED_TRACE(name);
      const SafetensorsTensor* tensor = file->Find(name);
      ASSERT_NE(tensor, nullptr);
      EXPECT_EQ(tensor->dtype, info["dtype"].get<std::string>());
      EXPECT_EQ(tensor->shape, info["shape"].get<std::vector<int64_t>>());
      absl::Span<const uint8_t> data = file->Data(*tensor);
      EXPECT_EQ(std::string(data.begin(), data.end()), HexDecode(info["hex"].get<std::string>()));
      if (info.contains("values")) {
        const std::vector<double> values = info["values"].get<std::vector<double>>();
        for (size_t i = 0; i < values.size(); ++i) {
          EXPECT_EQ(FloatAt(data, tensor->dtype, i), values[i]) << "element " << i;
        }
      }
    }
  }
}

TEST_F(PythonFixturesTest, WriterReproducesPythonFiles) {
  int byte_identical = 0;
  for (const auto& [filename, expected] : manifest_["files"].items()) {
    SCOPED_TRACE(filename);
    std::vector<SafetensorsTensorToWrite> tensors;
    for (const auto& [name, info] : expected["tensors"].items()) {
      tensors.push_back({name, info["dtype"].get<std::string>(),
                         info["shape"].get<std::vector<int64_t>>(),
                         HexDecode(info["hex"].get<std::string>())});
    }
    const auto metadata = expected["metadata"].get<std::map<std::string, std::string>>();
    const std::string ours = WriteSafetensors(tensors, metadata);
    std::ifstream in(FixturesDir() + "/" + filename, std::ios::binary);
    const std::string theirs((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
    if (metadata.size() <= 1) {
      // The reference keeps metadata in a hash map, so only files with at most one metadata key
      // have a fixed byte layout; those must match exactly.
      EXPECT_EQ(ours, theirs);
      ++byte_identical;
    } else {
      EXPECT_EQ(ours.size(), theirs.size());
      absl::StatusOr<SafetensorsFile> a = Parse(ours);
      absl::StatusOr<SafetensorsFile> b = Parse(theirs);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(a->metadata(), b->metadata());
      for (const SafetensorsTensor& t : b->tensors()) {
        const SafetensorsTensor* mine = a->Find(t.name);
        ASSERT_NE(mine, nullptr);
        EXPECT_EQ(mine->data_begin, t.data_begin);
        EXPECT_EQ(mine->data_end, t.data_end);
      }
    }
  }
  EXPECT_GE(byte_identical, 5);
}

}  // namespace
}  // namespace probesidecar::common
