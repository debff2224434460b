// The activation applied to each probe's score, shared by the GPU kernels, the CPU scorer, the
// float64 reference and the probe sets that name it. Plain C++ (also compiled by nvcc).
#pragma once

#include <cstdint>

namespace probesidecar::kernels {

enum class Activation : int32_t { kNone = 0, kSigmoid = 1 };

}  // namespace probesidecar::kernels
