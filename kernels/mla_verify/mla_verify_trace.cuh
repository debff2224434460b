// The device side of the sm_90a tile kernels' timestamp trace (mla_verify_trace.h says what is
// recorded and where). Without PROBESIDECAR_MLA_TRACE every call here compiles to nothing, so the
// kernels' code and register allocation are those of an untraced build.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mla_verify/mla_verify_trace.h"

#if defined(PROBESIDECAR_MLA_TRACE) && PROBESIDECAR_MLA_TRACE
#define PROBESIDECAR_MLA_TRACE_ON 1
#else
#define PROBESIDECAR_MLA_TRACE_ON 0
#endif

namespace probesidecar::kernels::mla {

inline constexpr bool kTraceOn = PROBESIDECAR_MLA_TRACE_ON != 0;

// Where a launch records (zeros: nowhere). Part of the launch arguments in every build.
struct TraceArgs {
  uint32_t* buffer = nullptr;
  int32_t max_blocks = 0;
  int32_t events_per_warpgroup = 0;
};

// One warpgroup's recorder: only the thread that Begin names records; the others hold nothing.
class TraceRecorder {
 public:
  __device__ __forceinline__ void Begin(const TraceArgs& args, int warpgroup, bool records) {
    if constexpr (kTraceOn) {
      out_ = nullptr;
      const int32_t block = blockIdx.y * gridDim.x + blockIdx.x;
      if (!records || args.buffer == nullptr || block >= args.max_blocks) return;
      cap_ = static_cast<uint32_t>(args.events_per_warpgroup);
      out_ = args.buffer + (static_cast<int64_t>(block) * 2 + warpgroup) * cap_ * 2;
      n_ = 2;
      out_[2] = GlobalTimer();
      t0_ = clock64();
    }
  }
  __device__ __forceinline__ void Add(MlaTraceEvent event, int32_t step) {
    if constexpr (kTraceOn) {
      if (out_ == nullptr || n_ >= cap_) return;
      const uint32_t dt = static_cast<uint32_t>(clock64() - t0_);
      *reinterpret_cast<uint2*>(out_ + 2 * n_) =
          make_uint2(dt, (static_cast<uint32_t>(event) << 24) | (step & 0xffffff));
      ++n_;
    }
  }
  __device__ __forceinline__ void End(int32_t step) {
    if constexpr (kTraceOn) {
      Add(MlaTraceEvent::kDone, step);
      if (out_ == nullptr) return;
      out_[3] = GlobalTimer();
      uint32_t sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      *reinterpret_cast<uint2*>(out_) = make_uint2(n_, sm);
    }
  }

 private:
  static __device__ __forceinline__ uint32_t GlobalTimer() {
    uint64_t ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return static_cast<uint32_t>(ns);
  }

  uint32_t* out_;
  uint32_t n_, cap_;
  long long t0_;
};

}  // namespace probesidecar::kernels::mla
