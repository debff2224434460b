// Counts the requests an executor drops because their lifetime ended (RequestLifetime::Check).
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "server/executors/executor.h"

namespace probesidecar::server {

class DropCounter {
 public:
  // Counts `status` once if it is the end of a lifetime (DEADLINE_EXCEEDED or CANCELLED).
  // Thread-safe.
  void Count(const absl::Status& status) {
    if (status.code() == absl::StatusCode::kDeadlineExceeded) {
      expired_.fetch_add(1, std::memory_order_relaxed);
    } else if (status.code() == absl::StatusCode::kCancelled) {
      cancelled_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  DroppedRequests counts() const {
    return {expired_.load(std::memory_order_relaxed), cancelled_.load(std::memory_order_relaxed)};
  }

 private:
  std::atomic<uint64_t> expired_{0};
  std::atomic<uint64_t> cancelled_{0};
};

}  // namespace probesidecar::server
