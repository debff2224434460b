// Properties of every refusal a fuzz target sees: one line, no raw control characters (names and
// values from the input are quoted and escaped), bounded length.
#pragma once

#include "absl/status/status.h"
#include "tests/fuzz/fuzz_check.h"

namespace probesidecar::fuzz {

inline void CheckRefusalMessage(const absl::Status& status) {
  FUZZ_CHECK(!status.ok());
  FUZZ_CHECK(status.code() != absl::StatusCode::kInternal);
  FUZZ_CHECK(status.code() != absl::StatusCode::kUnknown);
  const absl::string_view message = status.message();
  FUZZ_CHECK(!message.empty());
  FUZZ_CHECK(message.size() <= 1024);
  for (char c : message) {
    const unsigned char u = static_cast<unsigned char>(c);
    FUZZ_CHECK(u >= 0x20 && u != 0x7f);
  }
}

}  // namespace probesidecar::fuzz
