// Logging to stderr: one line per event, timestamped, safe from any thread.
#pragma once

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace probesidecar::server {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
// Writes "2026-11-29T09:00:00.123456Z I message" to stderr in one write.
void Log(LogLevel level, absl::string_view message);

template <typename... Args>
void LogAt(LogLevel level, const absl::FormatSpec<Args...>& format, const Args&... args) {
  if (LogEnabled(level)) Log(level, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogInfo(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogAt(LogLevel::kInfo, format, args...);
}
template <typename... Args>
void LogWarning(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogAt(LogLevel::kWarning, format, args...);
}
template <typename... Args>
void LogError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogAt(LogLevel::kError, format, args...);
}
template <typename... Args>
void LogDebug(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogAt(LogLevel::kDebug, format, args...);
}

}  // namespace probesidecar::server
