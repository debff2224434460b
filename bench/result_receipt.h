// Receipts for benchmark results (the C++ side of bench/receipt.py): every results file names
// the full commit that produced it, with "+dirty" when the tree had uncommitted changes, and the
// tools refuse to write results from a dirty tree unless asked. Plain C++, header-only.
#pragma once

#include <cctype>
#include <cstdlib>
#include <string>

#include "common/env.h"

namespace probesidecar::bench {

// The identity passed with --git, else $PROBE_SIDECAR_GIT (set by tests/gpu/run.sh), else "".
inline std::string ResultIdentity(const std::string& from_flag) {
  if (!from_flag.empty()) return from_flag;
  const char* env = common::ProjectEnv("GIT");
  return env != nullptr ? env : "";
}

// Empty when `identity` may be written; otherwise why not. A valid identity is 40 lowercase hex
// digits, optionally followed by "+dirty" (accepted only with allow_dirty).
inline std::string CheckResultIdentity(const std::string& identity, bool allow_dirty) {
  const std::string dirty = "+dirty";
  const bool is_dirty = identity.size() == 40 + dirty.size() &&
                        identity.compare(40, std::string::npos, dirty) == 0;
  if (identity.size() != 40 && !is_dirty) {
    return "'" + identity +
           "' is not a full 40-character commit: pass --git HASH or set PROBE_SIDECAR_GIT";
  }
  for (size_t i = 0; i < 40; ++i) {
    const char c = identity[i];
    if (!std::isdigit(static_cast<unsigned char>(c)) && (c < 'a' || c > 'f')) {
      return "'" + identity + "' is not a full 40-character commit";
    }
  }
  if (is_dirty && !allow_dirty) {
    return "the tree had uncommitted changes, so the results would not name their code; commit "
           "first, or pass --allow-dirty (the results are then marked +dirty)";
  }
  return "";
}

}  // namespace probesidecar::bench
