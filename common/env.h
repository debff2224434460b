// The project's environment variables are named PROBE_SIDECAR_*. Until the next release the older
// spelling PROBESIDECAR_* is read too, as a deprecated alias (a warning on stderr, once per
// name); the new name wins where both are set. Plain C++, header-only.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace probesidecar::common {

// `name` is the variable's name without its prefix (e.g. "GIT"); nullptr where neither is set.
inline const char* ProjectEnv(const char* name) {
  if (const char* value = std::getenv((std::string("PROBE_SIDECAR_") + name).c_str())) {
    return value;
  }
  const std::string old = std::string("PROBESIDECAR_") + name;
  const char* value = std::getenv(old.c_str());
  if (value != nullptr) {
    static std::mutex mu;
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(mu);
    if (warned.insert(old).second) {
      std::fprintf(stderr, "warning: %s is deprecated; set PROBE_SIDECAR_%s instead\n", old.c_str(),
                   name);
    }
  }
  return value;
}

}  // namespace probesidecar::common
