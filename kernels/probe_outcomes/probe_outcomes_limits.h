// The limits of probe outcomes that probe sets are checked against: plain C++, no CUDA.
#pragma once

namespace probesidecar::kernels {

// Histogram bounds a probe set may have (a bucket above the last bound comes on top).
inline constexpr int kMaxScoreBounds = 32;

}  // namespace probesidecar::kernels
