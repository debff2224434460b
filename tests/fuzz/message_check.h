// Properties of every refusal a fuzz target sees: one line, no raw control characters (names and
// values from the input are quoted and escaped), bounded length.
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "tests/fuzz/fuzz_check.h"

namespace probesidecar::fuzz {

inline void CheckRefusalMessage(const absl::Status& status) {
  FUZZ_CHECK(!status.ok());
  const absl::string_view message = status.message();
  bool printable = true;
  for (char c : message) {
    const unsigned char u = static_cast<unsigned char>(c);
    printable &= u >= 0x20 && u != 0x7f;
  }
  if (status.code() == absl::StatusCode::kInternal || status.code() == absl::StatusCode::kUnknown ||
      message.empty() || message.size() > 1024 || !printable) {
    std::fprintf(stderr, "refusal: code %d, %zu bytes: %.300s\n", static_cast<int>(status.code()),
                 message.size(), std::string(message).c_str());
  }
  FUZZ_CHECK(status.code() != absl::StatusCode::kInternal);
  FUZZ_CHECK(status.code() != absl::StatusCode::kUnknown);
  FUZZ_CHECK(!message.empty());
  FUZZ_CHECK(message.size() <= 1024);
  FUZZ_CHECK(printable);
}

}  // namespace probesidecar::fuzz
