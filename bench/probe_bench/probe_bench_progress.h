// The progress line: while a load runs, once per second, to stderr.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/probe_bench/probe_bench_stats.h"

namespace probesidecar::bench {

class Progress {
 public:
  // title: what runs (mode, shape, load point); sent: calls sent so far (read from the progress
  // thread). Disabled: prints nothing and starts no thread.
  Progress(std::string title, const Recorder& recorder, std::function<int64_t()> sent,
           bool enabled);
  ~Progress();  // stops the line

  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

 private:
  void Loop();

  const std::string title_;
  const Recorder& recorder_;
  const std::function<int64_t()> sent_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace probesidecar::bench
